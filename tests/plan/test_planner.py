"""The planner's verdict on a deviceless v5e:2x2 (libtpu): a stage that does not fit is named."""

from tests.plan import real_configs

pytestmark = real_configs.needs_libtpu


def test_8b_without_fsdp_does_not_fit_naming_the_update():
  from jtc.plan import hardware, planner  # pylint: disable=import-outside-toplevel
  c = real_configs.config('configs/real/qwen3_8b_math_dapo.py', **{
      'mesh.data': -1,
      'mesh.fsdp': 1,
      'optim.microbatch_prompts': 1
  })
  devices = hardware.topology_devices('v5e:2x2')
  p = planner.plan(c, devices, platform='tpu', chip=hardware.CHIPS['v5e'], target='v5e:2x2',
                   compiled_for='test', only=('update',))
  assert not p.fits
  assert "does not fit: stage 'update'" in p.verdict()
