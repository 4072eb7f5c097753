"""Tests of jtc.models.lora: B = 0 starts at the base exactly; the adapted forward equals the
merged weights' forward (training pass, prefill and decode of the sampler); gradients through
an `Adapted` policy are adapter gradients; a vmapped population shares one base; bad settings
are refused before compute."""
import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jtc.models import hf_import
from jtc.models import lora
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models import sampler
from jtc.models.model_config import ModelConfig

CONFIG = ModelConfig.tiny(vocab_size=32, dtype='float32', param_dtype='float32')
TARGETS = tuple(lora.TARGETS)


def _policy(rank=2, targets=TARGETS, *, random_b=True, seed=0):
  """(base, adapters) of the tiny model, B random (else the adapters would be a no-op)."""
  base = model_lib.init_params(CONFIG, jax.random.key(seed))
  adapters = lora.init_adapters(CONFIG, rank=rank, targets=targets)
  if random_b:
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    adapters = jax.tree.unflatten(tree, leaves)
  return base, adapters


def _tokens(B=3, L=7):
  tokens_BL = jax.random.randint(jax.random.key(7), (B, L), 1, CONFIG.vocab_size)
  mask_BL = jnp.ones((B, L), jnp.int32).at[0, :2].set(0)  # one left-padded row
  return tokens_BL, mask_BL


@jax.jit
def _logits(params, tokens_BL, mask_BL):
  return model_lib.forward(params, CONFIG, tokens_BL, model_lib.positions_from_mask(mask_BL),
                           mask_BL).logits_BLV


def test_zero_b_starts_at_the_base_exactly():
  base, adapters = _policy(random_b=False)
  policy = lora.Adapted(base, adapters, scale=4.0)
  tokens_BL, mask_BL = _tokens()
  np.testing.assert_array_equal(_logits(policy, tokens_BL, mask_BL),
                                _logits(base, tokens_BL, mask_BL))


@pytest.mark.parametrize('targets', [TARGETS, ('o',), ('k', 'down')])
def test_adapted_forward_equals_the_merged_weights(targets):
  base, adapters = _policy(targets=targets)
  policy = lora.Adapted(base, adapters, scale=2.0)
  merged = lora.merge(base, adapters, 2.0)
  tokens_BL, mask_BL = _tokens()
  got, want = _logits(policy, tokens_BL, mask_BL), _logits(merged, tokens_BL, mask_BL)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  # Known negative: the adapters change the policy.
  assert np.max(np.abs(want - _logits(base, tokens_BL, mask_BL))) > 1e-2
  # The merged kernels changed exactly where there are adapters.
  for name, (path, _) in lora.TARGETS.items():
    same = np.array_equal(merged['layers'][path[0]][path[1]]['kernel'],
                          base['layers'][path[0]][path[1]]['kernel'])
    assert same == (name not in targets), name


def test_sampler_prefill_and_decode_use_the_adapters():
  """Greedy decoding of the adapted policy equals that of the merged weights, token for token;
  its log-probs equal the training pass's on the sampled tokens."""
  base, adapters = _policy()
  policy, merged = lora.Adapted(base, adapters, scale=2.0), lora.merge(base, adapters, 2.0)
  prompts_BP = jnp.array([[0, 3, 4, 5], [6, 7, 8, 9]], jnp.int32)
  mask_BP = jnp.array([[0, 1, 1, 1], [1, 1, 1, 1]], jnp.int32)
  kw = dict(rng=jax.random.key(0), num_samples=2, max_new_tokens=6, eos_id=1, pad_id=0, greedy=True)
  got = sampler.sample(policy, CONFIG, prompts_BP, mask_BP, **kw)
  want = sampler.sample(merged, CONFIG, prompts_BP, mask_BP, **kw)
  np.testing.assert_array_equal(got.tokens_RL, want.tokens_RL)
  np.testing.assert_allclose(got.logps_RT, want.logps_RT, atol=1e-4)
  scored = logprobs.sequence_logprobs(policy, CONFIG, got.tokens_RL, got.input_mask_RL,
                                      completion_start=4)['logps']
  np.testing.assert_allclose(scored * got.completion_mask_RT, got.logps_RT, atol=1e-4)
  for layer_loop in ('scan', 'unroll'):
    other = sampler.sample(policy, CONFIG, prompts_BP, mask_BP, layer_loop=layer_loop, **kw)
    np.testing.assert_array_equal(other.tokens_RL, got.tokens_RL)


def test_gradients_through_the_policy_are_adapter_gradients():
  base, adapters = _policy()
  tokens_BL, mask_BL = _tokens()

  def loss(policy):
    return jnp.mean(_logits(policy, tokens_BL, mask_BL)**2)

  grads = jax.jit(jax.grad(loss))(lora.Adapted(base, adapters, scale=2.0))
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads.base))
  assert all(float(jnp.max(jnp.abs(g))) > 0.0 for g in jax.tree.leaves(grads.adapters))
  # The same gradient as differentiating the adapters alone, by finite differences on one entry.
  f = jax.jit(lambda a: loss(lora.Adapted(base, a, scale=2.0)))
  bump = jax.tree.map(jnp.zeros_like, adapters)
  bump['layers']['mlp']['up']['lora_b'] = bump['layers']['mlp']['up']['lora_b'].at[0, 0, 0].set(1)
  eps = 1e-3
  plus = jax.tree.map(lambda a, d: a + eps * d, adapters, bump)
  minus = jax.tree.map(lambda a, d: a - eps * d, adapters, bump)
  fd = (f(plus) - f(minus)) / (2 * eps)
  np.testing.assert_allclose(grads.adapters['layers']['mlp']['up']['lora_b'][0, 0, 0], fd,
                             rtol=2e-2)


def test_a_vmapped_population_shares_one_base():
  """Members' adapters on the member axis, the base un-mapped: member n equals its single
  policy; the jaxpr holds the base kernels once, no [E, ...] copy of them."""
  base, _ = _policy()
  members = [_policy(seed=s)[1] for s in (3, 5)]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *members)
  tokens_BL, mask_BL = _tokens()
  policy = lora.Adapted(base, stacked, scale=2.0)
  fn = lambda p, t, m: _logits(p, t, m)
  axes = (lora.member_in_axes(policy), 0, 0)
  assert axes[0].base is None and axes[0].adapters == 0
  both = jnp.stack([tokens_BL] * 2), jnp.stack([mask_BL] * 2)
  got = jax.vmap(fn, in_axes=axes)(policy, *both)
  for n, adapters in enumerate(members):
    want = _logits(lora.Adapted(base, adapters, scale=2.0), tokens_BL, mask_BL)
    np.testing.assert_allclose(got[n], want, atol=2e-5, rtol=1e-5)
  jaxpr = jax.make_jaxpr(jax.vmap(fn, in_axes=axes))(policy, *both)
  kernel = base['layers']['mlp']['up']['kernel']
  shapes = [v.aval.shape for eqn in jaxpr.eqns for v in eqn.outvars]
  assert (2,) + kernel.shape not in shapes and (2,) + kernel.shape[1:] not in shapes


def _section(**kw):
  return ml_collections.ConfigDict(
      dict(dict(rank=4, alpha=8.0, targets='q,k,v,o,gate,up,down'), **kw))


@pytest.mark.parametrize('kw, match', [
    (dict(rank=-1), 'rank=-1 must be an int >= 0'),
    (dict(targets='q,lm'), r"unknown target 'lm'; valid: \['q', 'k', 'v', 'o'"),
    (dict(targets=''), 'names no target'),
    (dict(targets='q,q'), 'repeats'),
    (dict(alpha=0.0), 'alpha=0.0 must be > 0'),
    (dict(rank=100), "rank=100 exceeds target 'k'.* at most 64"),
])
def test_bad_settings_are_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    lora.check_config(_section(**kw), CONFIG)


def test_rank_zero_accepts_anything_else():
  lora.check_config(_section(rank=0, alpha=-1.0, targets='nonsense'), CONFIG)


def test_adapter_layout_and_axes():
  adapters = lora.init_adapters(CONFIG, rank=3, targets=('q', 'o'))
  Y, D, N, H = CONFIG.n_layers, CONFIG.d_model, CONFIG.n_heads, CONFIG.head_dim
  assert adapters['layers']['attn']['q']['lora_a'].shape == (Y, D, 3)
  assert adapters['layers']['attn']['q']['lora_b'].shape == (Y, 3, N, H)
  assert adapters['layers']['attn']['o']['lora_a'].shape == (Y, N, H, 3)
  assert not np.any(adapters['layers']['attn']['o']['lora_b'])
  assert lora.is_adapters(adapters) and not lora.is_adapters(
      model_lib.init_params(CONFIG, jax.random.key(0)))
  axes = lora.logical_axes(adapters)
  assert axes['layers']['attn']['o']['lora_a'] == ('layers', None, None, None)
  # A depends on the fixed key only: every seed starts from the same adapters.
  again = lora.init_adapters(dataclasses.replace(CONFIG), rank=3, targets=('q', 'o'))
  np.testing.assert_array_equal(again['layers']['attn']['q']['lora_a'],
                                adapters['layers']['attn']['q']['lora_a'])


def test_merged_export_round_trips_through_hugging_face(tmp_path):
  """`hf_import.export_hf_checkpoint` of the merged weights (base + scaled A B) loads back as a
  plain policy whose logits equal the adapted model's within float tolerance."""
  base, adapters = _policy()
  policy = lora.Adapted(base, adapters, scale=2.0)
  out = hf_import.export_hf_checkpoint(CONFIG, policy, tmp_path / 'merged')
  config, loaded = hf_import.load_hf_checkpoint(out)
  assert not any(k in ADAPTER_LEAVES for k in _leaf_names(loaded))
  tokens_BL, mask_BL = _tokens()
  got = model_lib.forward(loaded, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                          mask_BL).logits_BLV
  np.testing.assert_allclose(got, _logits(policy, tokens_BL, mask_BL), atol=2e-5, rtol=1e-5)
  # Known negative: the base's own export differs.
  assert np.max(np.abs(got - _logits(base, tokens_BL, mask_BL))) > 1e-2


ADAPTER_LEAVES = lora.ADAPTER_KEYS


def _leaf_names(tree):
  return {getattr(p[-1], 'key', None) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}
