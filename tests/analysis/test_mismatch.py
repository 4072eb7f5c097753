"""The mismatch attribution (jtc.analysis.mismatch): each source measured on the same tokens. A
filter only removes probability mass, so its delta is the log of the kept mass, never positive; a
float32 KV-cache decode agrees with the full forward pass to float rounding; bfloat16 does not."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import mismatch
from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.models import bundles
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.models import sampler as sampler_lib
from jtc.models.model_config import ModelConfig

# 'dense' experts: a token's arithmetic does not depend on where the others are routed (the
# sorted implementations regroup the (token, expert) pairs, which moves float rounding).
MOE = ModelConfig.tiny_moe(vocab_size=23, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                           head_dim=8, n_experts=4, d_expert=16, moe_impl='dense')
PARAMS = model_lib.init_params(MOE, jax.random.key(3))
TOKENS, MASK = jnp.array([[5, 9, 14, 2], [0, 0, 7, 3]]), jnp.array([[1, 1, 1, 1], [0, 0, 1, 1]])
KW = dict(rng=jax.random.key(0), samples=4, max_new_tokens=12, eos_id=1, pad_id=0)


def test_each_source_has_the_sign_and_size_it_must_have():
  bundle = bundles.load_policy_bundle('base')
  prompts = [
      e['prompt'] for e in tasks_lib.get_task('arithmetic').examples('test', seed=0, num_examples=8)
  ]
  tokens, mask = data_lib.encode_prompts(bundle.tokenizer, prompts, width=20)
  rows = {
      r['source'].split(':')[0].split(' (')[0]: r for r in mismatch.attribute(
          bundle.params, dataclasses.replace(bundle.model_config, dtype='float32'),
          jnp.asarray(tokens), jnp.asarray(mask), rng=jax.random.key(0), samples=2,
          max_new_tokens=24, eos_id=bundle.tokenizer.eos_id, pad_id=bundle.tokenizer.pad_id)
  }
  assert rows['decode']['mean_abs'] < 1e-5  # float32: rounding only
  assert rows['bf16 model vs float32 model']['mean_abs'] > 10 * rows['decode']['mean_abs']
  for name in ('top-k 5', 'top-p 0.9', 'min-p 0.1'):
    r = rows[name]
    assert r['mean'] < 0 and np.isclose(r['mean_abs'], -r['mean'], rtol=1e-3, atol=1e-6), r
  assert rows['temperature 0.7']['mean_abs'] > 1e-3  # a tempered distribution is another one


def test_routing_flips_compare_sets_and_skip_unrouted_tokens():
  sampler = jnp.array([[[[0, 1], [2, 3]], [[-1, -1], [-1, -1]]]])  # [B=1, T=2, Y=2, W=2]
  trainer = jnp.array([[[[1, 0], [2, 4]], [[5, 6], [7, 0]]]])
  np.testing.assert_array_equal(mismatch.routing_flips(sampler, trainer),
                                [[[False, True], [False, False]]])
  flips = jnp.array([[[False, True], [True, True], [False, False], [True, False]]])  # [1, 4, 2]
  delta = jnp.array([[0.5, -1.0, 2.0, 8.0]])
  m = mismatch.routing_metrics(flips, delta, jnp.array([[1, 1, 1, 0]]))
  np.testing.assert_allclose(m['flip_rate'], 2 / 3)
  np.testing.assert_allclose(m['flip_rate_layer'], [1 / 3, 2 / 3])
  np.testing.assert_allclose(m['abs_delta_share'], 1.5 / 3.5)
  np.testing.assert_allclose([m['flipped_mean_abs'], m['kept_mean_abs']], [0.75, 2.0])


@pytest.mark.slow
def test_routing_source_controls():
  """A random tiny mixture-of-experts policy. Negative control: the same float32 weights in the
  sampler and the trainer flip no token's experts, and replaying the sampler's routing leaves
  float rounding only. Positive control: a perturbed sampler router flips a good share of
  tokens and replaying its routing removes a good share of the gap (what remains is the
  perturbed router's expert weights)."""
  rows, same = mismatch.routing_rows(PARAMS, PARAMS, MOE, TOKENS, MASK, **KW)
  rows = {r['source'].strip(): r for r in rows}
  assert float(same['flip_rate']) == 0 and float(same['abs_delta_share']) == 0
  assert rows["with the sampler's routing replayed"]['max_abs'] < 1e-5
  perturbed = mismatch.perturb_router(PARAMS, 0.5, jax.random.key(1))
  _, flipped = mismatch.routing_rows(PARAMS, perturbed, MOE, TOKENS, MASK, **KW)
  assert float(flipped['flip_rate']) > 0.2 and float(flipped['abs_delta_share']) > 0.2
  assert float(flipped['replay_removed_share']) > 0.3


def test_replay_changes_log_probs_exactly_from_the_first_flip_on():
  """Log-probs with and without the sampler's routing replayed are bit-identical for every token
  predicted before the first routing flip of its row (prompt included) and differ from it on:
  causal attention carries a flip in a layer below the last to every later position, never an
  earlier one; a flip in the last layer changes its own position's prediction alone (no later
  position reads that layer's output)."""
  perturbed = mismatch.perturb_router(PARAMS, 0.5, jax.random.key(1))
  out = sampler_lib.sample(perturbed, MOE, TOKENS, MASK, rng=KW['rng'], num_samples=4,
                           max_new_tokens=12, eos_id=1, pad_id=0, return_routing=True)
  P = TOKENS.shape[1]
  score = lambda **kw: logprobs.sequence_logprobs(PARAMS, MOE, out.tokens_RL, out.input_mask_RL,
                                                  completion_start=P, **kw)
  own, replayed = score(), score(replay_BLYW=out.experts_RLYW)
  trainer_RLYW = model_lib.forward(PARAMS, MOE, out.tokens_RL,
                                   model_lib.positions_from_mask(out.input_mask_RL),
                                   out.input_mask_RL).routed.experts_BLW.transpose(1, 2, 0, 3)
  flip_RLY = np.asarray(mismatch.routing_flips(out.experts_RLYW, trainer_RLYW))
  changed_RL = np.logical_or.accumulate(flip_RLY[..., :-1].any(-1), axis=1) | flip_RLY[..., -1]
  before_RT = ~changed_RL[:, P - 1:P + 11]  # token t is predicted at position P - 1 + t
  real_RT = np.asarray(out.completion_mask_RT) > 0
  same_RT = np.asarray(own['logps']) == np.asarray(replayed['logps'])
  assert flip_RLY.any() and (before_RT & real_RT).any() and (~before_RT & real_RT).any()
  assert same_RT[before_RT & real_RT].all()
  assert not same_RT[~before_RT & real_RT].any()
