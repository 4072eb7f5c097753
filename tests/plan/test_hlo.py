"""FLOPs read from a lowered program (`jtc.plan.hlo`), loops counted by their trip counts."""

from tests.plan import real_configs

pytestmark = real_configs.needs_libtpu


def test_update_flops_are_trip_count_corrected():
  """Update FLOPs against a closed form: 6 N_trunk per token of the L-token rows, 8 D V per
  completion token (the LM head's vocabulary scan recomputes its logits in the backward).
  Negative control: every loop body counted once (as XLA's cost_analysis does) falls far short."""
  from jtc.plan import hardware, hlo, planner  # pylint: disable=import-outside-toplevel
  # A narrow model (compiles in seconds) whose vocabulary takes two chunks of the LM head's scan.
  small = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=16_384)
  c = real_configs.config(
      model=small, **{
          'policy.remat': False,
          'optim.microbatch_prompts': 2,
          'optim.minibatch_prompts': 4,
          'rollout.prompts_per_step': 4,
          'rollout.sampling.num_samples': 4,
          'data.prompt_width': 16,
          'rollout.sampling.max_new_tokens': 112,
          'mesh.data': 1,
          'mesh.fsdp': 4
      })
  devices = hardware.topology_devices('v5e:2x2')
  s = planner.build_step(c, devices, 'tpu')
  (update,) = [st for st in s.stages('tpu') if st.name == 'update']
  # The FLOPs come from the lowered program (the planner reads them there), so nothing compiles.
  text = update.fn.trace(*update.args).lower().as_text(dialect='hlo')
  flops = hlo.program_costs(text).flops / len(devices)
  m = s.model_config
  rows, L, T = 4 * 4, 16 + 112, 112
  head = m.d_model * m.vocab_size
  trunk = real_configs.n_params(s) - head  # tied embeddings: the head is the embedding
  want = (6 * trunk * rows * L + 8 * head * rows * T) / len(devices)
  assert 0.97 < flops / want < 1.10
  # Known negative: each loop body counted once (XLA's `cost_analysis()` convention).
  assert hlo.program_costs(text, trip_counts=False).flops / len(devices) < 0.6 * want
