"""FLOPs read from a lowered program (`jtc.plan.hlo`), loops counted by their trip counts."""

from tests.plan import real_configs

pytestmark = real_configs.needs_libtpu


def _lowered_update(model, *config_path, **overrides):
  """(step, HLO text, devices): the update stage of a real config shrunk to ``model``, 4 prompts
  x 4 rows of 16 + 112 tokens in mini-batches of 4 and micro-batches of 2 prompts, over fsdp 4 of
  a v5e:2x2, lowered (the planner reads FLOPs there, so nothing compiles)."""
  from jtc.plan import hardware, planner  # pylint: disable=import-outside-toplevel
  c = real_configs.config(
      *config_path, model=model, **{
          'policy.remat': False,
          'optim.microbatch_prompts': 2,
          'optim.minibatch_prompts': 4,
          'rollout.prompts_per_step': 4,
          'rollout.sampling.num_samples': 4,
          'data.prompt_width': 16,
          'rollout.sampling.max_new_tokens': 112,
          'mesh.data': 1,
          'mesh.fsdp': 4,
          **overrides
      })
  devices = hardware.topology_devices('v5e:2x2')
  s = planner.build_step(c, devices, 'tpu')
  (update,) = [st for st in s.stages('tpu') if st.name == 'update']
  return s, update.fn.trace(*update.args).lower().as_text(dialect='hlo'), devices


def test_update_flops_are_trip_count_corrected():
  """Update FLOPs against a closed form: 6 N_trunk per token of the L-token rows, 8 D V per
  completion token (the LM head's vocabulary scan recomputes its logits in the backward).
  Negative control: every loop body counted once (as XLA's cost_analysis does) falls far short."""
  from jtc.plan import hlo  # pylint: disable=import-outside-toplevel
  # A narrow model (compiles in seconds) whose vocabulary takes two chunks of the LM head's scan.
  small = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=16_384)
  s, text, devices = _lowered_update(small)
  flops = hlo.program_costs(text).flops / len(devices)
  m = s.model_config
  rows, L, T = 4 * 4, 16 + 112, 112
  head = m.d_model * m.vocab_size
  trunk = real_configs.n_params(s) - head  # tied embeddings: the head is the embedding
  want = (6 * trunk * rows * L + 8 * head * rows * T) / len(devices)
  assert 0.97 < flops / want < 1.10
  # Known negative: each loop body counted once (XLA's `cost_analysis()` convention).
  assert hlo.program_costs(text, trip_counts=False).flops / len(devices) < 0.6 * want


def test_moe_update_flops_count_the_experts_ragged_dots_per_shard():
  """A MoE update (rows over fsdp 4: each shard sorts and runs its own experts' pairs in a
  `jax.shard_map`, `moe.rows_local`) against the closed form with the *active* trunk: the
  experts' matmuls count W of X experts per token (2 x 3 D F W forward, twice that backward: the
  `ragged-dot`s' input and weight gradients). Known negatives: ragged-dots not counted (as before)
  and shard_map bodies counted once both fall far short."""
  from jtc.plan import hlo  # pylint: disable=import-outside-toplevel
  small = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=16_384, n_experts=8,
               experts_per_token=2, d_expert=2048, moe_impl='ragged')
  s, text, devices = _lowered_update(small, 'configs/real/qwen3_30b_a3b_math_dapo.py',
                                     **{'mesh.tensor': 1})
  assert 'ragged-dot(' in text and 'xla.sdy.manual_computation_body' in text
  m = s.model_config
  rows, L, T = 4 * 4, 16 + 112, 112
  head = m.d_model * m.vocab_size
  idle = m.n_layers * (m.n_experts - m.experts_per_token) * 3 * m.d_model * m.d_expert
  trunk = real_configs.n_params(s) - 2 * head - idle  # untied: embedding and head
  want = (6 * trunk * rows * L + 8 * head * rows * T) / len(devices)
  flops = lambda t: hlo.program_costs(t).flops / len(devices)
  assert 0.97 < flops(text) / want < 1.10
  assert flops(text.replace('ragged-dot(', 'ragged-dox(')) < 0.8 * want
  assert flops(text.replace('xla.sdy.manual_computation_body', 'body')) < 0.8 * want
