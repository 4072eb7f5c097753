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


def test_a_moe_planned_for_a_gpu_counts_its_routed_experts_flops():
  """--gpu compiles for the host CPU, whose lowering of `ragged_dot` is a masked dense product
  over every expert; the planner counts the FLOPs of the stage lowered for CUDA (grouped
  matmuls): a behaviour pass of a shrunk 30B config (D 256, 8 experts of 2048, 2 per token) at
  2 N_active per token (+ 2 D V per completion token), where the host's lowering (known
  negative) counts every expert on every token."""
  import jax  # pylint: disable=import-outside-toplevel
  from jtc.models import moe_dispatch  # pylint: disable=import-outside-toplevel
  from jtc.plan import estimate, hlo, planner  # pylint: disable=import-outside-toplevel
  small = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=16_384, n_experts=8,
               experts_per_token=2, d_expert=2048)
  c = real_configs.config(
      'configs/real/qwen3_30b_a3b_math_dapo.py', model=small, **{
          'rollout.prompts_per_step': 2,
          'rollout.chunk_prompts': 2,
          'rollout.score_chunk_prompts': 2,
          'optim.microbatch_prompts': 1,
          'rollout.sampling.num_samples': 4,
          'data.prompt_width': 16,
          'rollout.sampling.max_new_tokens': 112,
          'mesh.fsdp': 1,
          'mesh.tensor': 1
      })
  s = planner.build_step(c, jax.devices('cpu')[:1], 'gpu')
  (behaviour,) = [st for st in s.stages('gpu') if st.name == 'behaviour']
  with moe_dispatch.mesh_context(s.mesh, s.model_config):
    host = behaviour.fn.trace(*behaviour.args, **behaviour.kwargs).lower()
    cuda = planner.flops_lowering(behaviour, host, 'gpu', s.model_config)
  m = s.model_config
  rows, L, T = 2 * 4, 16 + 112, 112
  head = m.d_model * m.vocab_size
  n = real_configs.n_params(s)
  want = 2 * (estimate.active_params(m, n) - 2 * head) * rows * L + 2 * head * rows * T
  flops = lambda lowered: hlo.program_costs(lowered.as_text(dialect='hlo')).flops
  assert 0.97 < flops(cuda) / want < 1.10
  assert flops(host) > 2 * want
