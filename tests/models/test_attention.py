"""Blockwise attention (online softmax, recomputing backward) against the dense reference."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import attention
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig


def _inputs(dtype, B=2, L=37, N=4, K=2, H=8, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (
      jnp.asarray(rng.normal(size=s), dtype) for s in ((B, L, N, H), (B, L, K, H), (B, L, K, H)))
  mask = np.ones((B, L), bool)
  mask[0, :5] = False  # left padding
  mask[1, :2] = False
  mask[1, 30:] = False  # pads after EOS
  # Queries that see at least one key (the others' outputs are meaningless in both).
  valid = np.cumsum(mask, 1) > 0
  w = jnp.asarray(rng.normal(size=(B, L, N, H)), dtype) * valid[:, :, None, None]
  return q, k, v, jnp.asarray(mask), valid, w


@pytest.mark.parametrize('block', [8, 16, 64])
def test_blockwise_equals_dense_outputs_and_gradients(block):
  q, k, v, mask, valid, w = _inputs(jnp.float32)
  config = ModelConfig.tiny()

  def loss(fn, q, k, v):
    out = fn(q, k, v)
    return jnp.sum(out * w), out

  dense = lambda q, k, v: attention.dense_attention(q, k, v, mask, config)
  blockwise = lambda q, k, v: attention.blockwise_attention(q, k, v, mask, block=block)
  grad = lambda fn: jax.jit(
      jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))
  (_, out_d), g_d = grad(dense)(q, k, v)
  (_, out_b), g_b = grad(blockwise)(q, k, v)
  np.testing.assert_allclose(np.asarray(out_b)[valid], np.asarray(out_d)[valid], atol=2e-6)
  for a, b in zip(g_b, g_d):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def _numpy_attention(q, k, v, mask):
  """float64 softmax(q k^T / sqrt(H)) v over allowed = causal & mask, GQA by repeating k, v."""
  B, L, N, H = q.shape
  K = k.shape[2]
  k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
  s = np.einsum('blnh,bsnh->bnls', q, k) / np.sqrt(H)
  allowed = np.tril(np.ones((L, L), bool))[None] & mask[:, None, :]
  s = np.where(allowed[:, None], s, -1e300)
  p = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum('bnls,bsnh->blnh', p / p.sum(-1, keepdims=True), v)


def test_blockwise_float64_against_numpy():
  with jax.enable_x64(True):
    q, k, v, mask, valid, _ = _inputs(jnp.float64)
    out = jax.jit(functools.partial(attention.blockwise_attention, block=8))(q, k, v, mask)
    assert out.dtype == jnp.float64
    want = _numpy_attention(*(np.asarray(x) for x in (q, k, v, mask)))
    np.testing.assert_allclose(np.asarray(out)[valid], want[valid], atol=1e-12)


def test_blockwise_backward_holds_no_LxS_scores():
  """The gradient program's largest intermediate is a block's scores, not [L, S] (known
  positive: the dense program holds [B, K, Q, L, S])."""
  L, C = 1024, 128
  q = jax.ShapeDtypeStruct((1, L, 4, 32), jnp.float32)
  kv = jax.ShapeDtypeStruct((1, L, 2, 32), jnp.float32)
  mask = jax.ShapeDtypeStruct((1, L), bool)
  config = ModelConfig.tiny()
  temp = {}
  for name, fn in (('dense', lambda q, k, v, m: attention.dense_attention(q, k, v, m, config)),
                   ('blockwise',
                    lambda q, k, v, m: attention.blockwise_attention(q, k, v, m, block=C))):
    grad = jax.jit(jax.grad(lambda q, k, v, m: jnp.sum(fn(q, k, v, m)), argnums=(0, 1, 2)))
    temp[name] = grad.lower(q, kv, kv, mask).compile().memory_analysis().temp_size_in_bytes
  scores = 4 * L * L * 4  # one [N, L, S] float32
  assert temp['dense'] >= scores
  assert temp['blockwise'] < scores / 4


def test_model_logprobs_blockwise_equal_dense():
  """The model's log-probs with either attention (its wiring: masks, positions, GQA; the
  gradients are checked on the attention itself above)."""
  config = ModelConfig.tiny(vocab_size=48)
  rng = np.random.default_rng(1)
  # Random parameters of the right shapes without compiling `init_params`.
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.2, x.dtype),
                        jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0))))
  tokens = jnp.asarray(rng.integers(0, 48, size=(3, 40)), jnp.int32)
  mask = np.ones((3, 40), np.int32)
  mask[0, :6] = 0
  mask[2, 33:] = 0
  out = {}
  for name in ('dense', 'blockwise'):
    c = dataclasses.replace(config, attention=name)
    out[name] = jax.jit(lambda p, c=c: logprobs.sequence_logprobs(p, c, tokens, jnp.asarray(
        mask), completion_start=10)['logps'])(params)
  real = mask[:, 10:] > 0
  np.testing.assert_allclose(out['blockwise'][real], out['dense'][real], atol=2e-5, rtol=1e-5)


def test_resolve_names_bad_value_and_platform():
  assert attention.resolve('auto', 'cpu') == 'dense'
  assert attention.resolve('auto', 'tpu') == 'blockwise'
  with pytest.raises(ValueError, match="attention='flash'"):
    attention.resolve('flash', 'cpu')
  with pytest.raises(ValueError, match="'metal'"):
    attention.resolve('auto', 'metal')
