"""The planner's verdict on a deviceless v5e:2x2 (libtpu): a stage that does not fit is named."""

import pytest

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


@pytest.mark.slow  # one update compile of the 0.6B shape: ~100 s on a busy 2-core machine
def test_lora_update_arguments_are_the_base_the_adapters_and_adamw():
  """The compiler's argument bytes of a LoRA update (the trainer's jitted function, the base as
  its fourth argument) are the planner's resident accounting: base + adapters + AdamW + the
  mini-batch, and nothing else resident meanwhile."""
  from jtc.plan import hardware, planner  # pylint: disable=import-outside-toplevel
  from jtc.rl import stages  # pylint: disable=import-outside-toplevel
  c = real_configs.config(**{'lora.rank': 4, 'loss.hparams.kl_coef': 0.01})
  devices = hardware.topology_devices('v5e:2x2')
  p = planner.plan(c, devices, platform='tpu', chip=hardware.CHIPS['v5e'], target='v5e:2x2',
                   compiled_for='test', only=('update',))
  s = planner.build_step(c, devices, 'tpu')
  update = next(st for st in s.stages('tpu') if st.name == 'update')
  parts = s.resident_parts()
  want = parts['base'] + parts['params'] + parts['opt_state'] + stages.chip_bytes(update.args[1:3])
  (row,) = p.rows
  assert row.arguments == pytest.approx(want, rel=1e-3)
  # Held meanwhile: the step's batch alone (the state is among its arguments).
  assert row.resident_other == stages.chip_bytes(stages.step_batch(s))
  assert p.resident['frozen base'] == parts['base']
  assert p.fits
