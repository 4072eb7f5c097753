"""Tests of jtc.models.moe against a per-token loop written from the formula, the two dropless
implementations against each other (values and gradients), routing replay, and the
load-balancing loss against Hugging Face's ``load_balancing_loss_func``."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import moe
from jtc.models.model_config import ModelConfig

CONFIG = ModelConfig.tiny_moe(d_model=16, n_experts=6, experts_per_token=2, d_expert=8,
                              d_shared_expert=12)
B, L = 3, 5
ffn = jax.jit(moe.feed_forward, static_argnums=2)


def _params(config, seed=0):
  return moe.init_ffn(config, jax.random.key(seed))


def _x(seed=1):
  return jax.random.normal(jax.random.key(seed), (B, L, CONFIG.d_model))


def _reference(p, x_BLD, config, experts_BLW=None):
  """y of every token by a loop over its chosen experts, in float64 numpy."""
  f = lambda a: np.asarray(a, np.float64)
  silu = lambda z: z / (1 + np.exp(-z))
  router, out = f(p['router']['kernel']), np.zeros(x_BLD.shape)
  for b in range(x_BLD.shape[0]):
    for l in range(x_BLD.shape[1]):
      x = f(x_BLD[b, l])
      z = x @ router
      probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
      chosen = (np.argsort(-probs, kind='stable')[:config.experts_per_token]
                if experts_BLW is None else np.asarray(experts_BLW[b, l]))
      w = probs[chosen] / (probs[chosen].sum() if config.norm_topk_prob else 1.0)
      for j, e in zip(w, chosen):
        h = silu(x @ f(p['expert_gate']['kernel'][e])) * (x @ f(p['expert_up']['kernel'][e]))
        out[b, l] += j * h @ f(p['expert_down']['kernel'][e])
      if 'shared' in p:
        s = p['shared']
        h = silu(x @ f(s['gate']['kernel'])) * (x @ f(s['up']['kernel']))
        gate = 1 / (1 + np.exp(-(x @ f(p['shared_gate']['kernel']))))
        out[b, l] += gate * (h @ f(s['down']['kernel']))
  return out


@pytest.mark.parametrize('impl', list(moe.MOE_IMPLS))
@pytest.mark.parametrize('norm_topk_prob, shared', [(True, 12), (False, 0)])
def test_feed_forward_matches_the_formula_token_by_token(impl, norm_topk_prob, shared):
  config = dataclasses.replace(CONFIG, moe_impl=impl, norm_topk_prob=norm_topk_prob,
                               d_shared_expert=shared)
  p, x_BLD = _params(config), _x()
  y_BLD, routed = ffn(p, x_BLD, config)
  np.testing.assert_allclose(y_BLD, _reference(p, x_BLD, config), rtol=1e-5, atol=1e-5)
  assert routed.experts_BLW.shape == (B, L, 2) and routed.experts_BLW.dtype == jnp.int32
  # The counts: each token chooses W experts; the probabilities of a token sum to 1.
  np.testing.assert_allclose(jnp.sum(routed.load_X), B * L * 2)
  np.testing.assert_allclose(jnp.sum(routed.prob_X), B * L, rtol=1e-5)


def test_dropless_when_every_token_picks_the_same_experts():
  """A router that sends all tokens to experts 4 and 1: nothing is dropped (a capacity-based
  layer would keep at most a share of them), every token gets its two experts' output."""
  p = _params(CONFIG)
  p['router']['kernel'] = jnp.zeros_like(p['router']['kernel'])
  x_BLD = jnp.abs(_x()) + 0.1  # positive inputs, so the router below prefers 4 over 1 over rest
  p['router']['kernel'] = p['router']['kernel'].at[:, 4].set(1.0).at[:, 1].set(0.5)
  for impl in moe.MOE_IMPLS:
    config = dataclasses.replace(CONFIG, moe_impl=impl)
    y_BLD, routed = ffn(p, x_BLD, config)
    assert np.all(np.asarray(routed.experts_BLW) == [4, 1])
    np.testing.assert_allclose(y_BLD, _reference(p, x_BLD, config), rtol=1e-5, atol=1e-5)


def test_the_implementations_agree_in_value_and_gradient():
  p, x_BLD = _params(CONFIG), _x()
  mask_BL = jnp.ones((B, L)).at[0, :2].set(0)

  def loss(p, x, impl):
    config = dataclasses.replace(CONFIG, moe_impl=impl)
    y, routed = moe.feed_forward(p, x, config, mask_BL=mask_BL)
    aux = moe.load_balancing_loss(jax.tree.map(lambda a: a[None], routed), mask_BL)
    return jnp.sum(jnp.sin(y)) + aux

  grads = {
      impl: jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(p, x_BLD, impl)
      for impl in moe.MOE_IMPLS
  }
  for impl in ('ragged', 'blocks'):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads[impl],
                 grads['dense'])
  # Every parameter gets a gradient (the router through the weights and the auxiliary loss).
  assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads['ragged'][0]))


def test_replay_of_the_own_choice_or_of_none_changes_nothing():
  p, x_BLD = _params(CONFIG), _x()
  y_BLD, routed = ffn(p, x_BLD, CONFIG)
  same, _ = ffn(p, x_BLD, CONFIG, replay_BLW=routed.experts_BLW)
  off, _ = ffn(p, x_BLD, CONFIG, replay_BLW=jnp.full((B, L, 2), -1))
  np.testing.assert_array_equal(same, y_BLD)
  np.testing.assert_array_equal(off, y_BLD)


def test_replay_uses_the_given_experts_weighted_by_the_router():
  """Replayed experts on some tokens (-1 elsewhere): those tokens get the formula with the given
  experts and the router's renormalised probabilities of them; the router still sees the
  gradient of the replayed experts' weights; `Routed` keeps the router's own choice."""
  p, x_BLD = _params(CONFIG), _x()
  _, own = ffn(p, x_BLD, CONFIG)
  replay_BLW = jnp.full((B, L, 2), -1).at[1, 2].set(jnp.array([5, 0])).at[2,
                                                                          0].set(jnp.array([3, 2]))
  y_BLD, routed = ffn(p, x_BLD, CONFIG, replay_BLW=replay_BLW)
  used_BLW = jnp.where(replay_BLW >= 0, replay_BLW, own.experts_BLW)
  np.testing.assert_allclose(y_BLD, _reference(p, x_BLD, CONFIG, used_BLW), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(routed.experts_BLW, own.experts_BLW)
  grad = jax.jit(
      jax.grad(lambda r: jnp.sum(
          moe.feed_forward({
              **p, 'router': {
                  'kernel': r
              }
          }, x_BLD[1:2, 2:3], CONFIG, replay_BLW=replay_BLW[1:2, 2:3])[0])))(p['router']['kernel'])
  assert float(jnp.max(jnp.abs(grad))) > 0


def test_load_balancing_loss_is_hugging_faces():
  torch = pytest.importorskip('torch')
  qwen3_moe = pytest.importorskip('transformers.models.qwen3_moe.modeling_qwen3_moe')
  Y, X, W = 3, 6, 2
  rng = np.random.default_rng(0)
  logits_YBLX = rng.normal(size=(Y, B, L, X)).astype(np.float32)
  mask_BL = (rng.uniform(size=(B, L)) > 0.3).astype(np.int64)
  ref = qwen3_moe.load_balancing_loss_func(
      tuple(torch.from_numpy(l.reshape(B * L, X)) for l in logits_YBLX), X, W,
      torch.from_numpy(mask_BL))
  probs_YBLX = jax.nn.softmax(jnp.asarray(logits_YBLX), axis=-1)
  _, top_YBLW = jax.lax.top_k(probs_YBLX, W)
  m = jnp.asarray(mask_BL, jnp.float32)
  routed = moe.Routed(experts_BLW=top_YBLW, load_X=jnp.einsum('YBLWX,BL->YX',
                                                              jax.nn.one_hot(top_YBLW, X), m),
                      prob_X=jnp.einsum('YBLX,BL->YX', probs_YBLX, m))
  np.testing.assert_allclose(moe.load_balancing_loss(routed, m), float(ref), rtol=1e-5)
  # Perfect balance gives W: uniform probabilities and equal loads.
  even = moe.Routed(experts_BLW=top_YBLW, load_X=jnp.full((Y, X), W * 10.0 / X), prob_X=jnp.full(
      (Y, X), 10.0 / X))
  np.testing.assert_allclose(moe.load_balancing_loss(even, jnp.ones((2, 5))), W, rtol=1e-6)


@pytest.mark.parametrize('block', [1, 2, 64])
def test_blocks_of_any_size_hold_every_pair(block):
  """Experts with no pair, with one and with several blocks' worth: the block layout drops and
  duplicates nothing, whatever C."""
  p, x_UD = _params(CONFIG), _x().reshape(B * L, -1)
  experts_UW = jnp.stack([jnp.arange(B * L) % 3, jnp.full(B * L, 5)], axis=1)  # 3, 4 unused
  weights_UW = jax.random.uniform(jax.random.key(2), (B * L, 2))
  dense = moe._experts_dense(p, x_UD, experts_UW, weights_UW, jnp.float32)
  blocks = jax.jit(moe._experts_blocks, static_argnums=(4, 5))(p, x_UD, experts_UW, weights_UW,
                                                               jnp.float32, block)
  np.testing.assert_allclose(blocks, dense, rtol=1e-5, atol=1e-6)


def _pair_sort_lengths(mesh_sizes, impl):
  """The lengths of the 1-D sorts (the (token, expert) pairs by expert) in the gradient program
  of `moe.feed_forward` on [4, 5] tokens traced under an abstract mesh of ``mesh_sizes``."""
  config = dataclasses.replace(CONFIG, moe_impl=impl)
  p = jax.eval_shape(lambda: _params(config))
  x = jax.ShapeDtypeStruct((4, L, CONFIG.d_model), jnp.float32)
  mesh = jax.sharding.AbstractMesh(tuple(mesh_sizes.values()), tuple(mesh_sizes))

  def grad(p, x):
    with jax.sharding.use_abstract_mesh(mesh):
      return jax.grad(lambda p: jnp.sum(moe.feed_forward(p, x, config)[0]))(p)

  lengths = set()

  def walk(jaxpr):
    for e in jaxpr.eqns:
      if e.primitive.name == 'sort' and e.invars[0].aval.ndim == 1:
        lengths.add(e.invars[0].aval.shape[0])
      for sub in jax.extend.core.jaxprs_in_params(e.params):
        walk(sub)

  walk(jax.make_jaxpr(grad)(p, x).jaxpr)
  return lengths


@pytest.mark.parametrize('impl', ['ragged', 'blocks'])
def test_each_batch_shard_sorts_its_own_pairs(impl):
  """Under a mesh whose batch axes (data x fsdp = 4) split the 4 rows, the sorted forms sort each
  shard's 1 x 5 x W pairs (`moe.rows_local`), not the batch's 4 x 5 x W (which XLA would gather
  on every chip); without batch shards, or with 3 that do not divide the rows, the whole batch's
  (the values are those of one device: tests/rl/test_sharding.py)."""
  pairs = 4 * L * CONFIG.experts_per_token
  assert _pair_sort_lengths({'data': 2, 'fsdp': 2, 'tensor': 2}, impl) == {pairs // 4}
  assert _pair_sort_lengths({'data': 1, 'fsdp': 1, 'tensor': 2}, impl) == {pairs}
  assert _pair_sort_lengths({'data': 3, 'fsdp': 1}, impl) == {pairs}
