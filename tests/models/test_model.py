"""Tests of jtc.models.model: the decoder against a numpy reference, its parameter layout, the KV
cache, left-padding invariance, bf16, compile size flat in depth."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.models.model_config import ModelConfig
from tests.models.model_reference import CONFIGS, random_params, padded_batch, ROWS


def _rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _inv_freq(c, j):
  """Frequency j of RoPE, written from the definitions (float64, one frequency at a time)."""
  f = c.rope_theta**(-2.0 * j / c.head_dim)
  if c.rope_scaling == 'linear':
    return f / c.rope_factor
  if c.rope_scaling == 'llama3':
    wavelength = 2 * np.pi / f
    if wavelength < c.rope_original_max_len / c.rope_high_freq_factor:  # high frequency: kept
      return f
    if wavelength > c.rope_original_max_len / c.rope_low_freq_factor:  # low: divided
      return f / c.rope_factor
    s = ((c.rope_original_max_len / wavelength - c.rope_low_freq_factor) /
         (c.rope_high_freq_factor - c.rope_low_freq_factor))
    return (1 - s) * f / c.rope_factor + s * f
  return f


def _rope(x_H, pos, c):
  H = x_H.shape[0]
  out = np.empty_like(x_H)
  for j in range(H // 2):
    angle = pos * _inv_freq(c, j)
    a, b = x_H[j], x_H[j + H // 2]
    out[j] = a * np.cos(angle) - b * np.sin(angle)
    out[j + H // 2] = b * np.cos(angle) + a * np.sin(angle)
  return out


def reference_logits(params, c, tokens_BL, mask_BL):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), model_lib.unstack_layers(params))
  B, L = tokens_BL.shape
  logits = np.zeros((B, L, c.vocab_size))
  for b in range(B):
    real = [i for i in range(L) if mask_BL[b, i]]
    pos = {i: n for n, i in enumerate(real)}
    x = np.stack([p['embed']['embedding'][tokens_BL[b, i]] for i in range(L)])
    for layer in range(c.n_layers):
      lp = p[f'layers_{layer}']
      a = lp['attn']
      h = _rms(x, lp['attn_norm']['scale'], c.norm_eps)
      attn_out = np.zeros_like(x)
      for n in range(c.n_heads):
        kvh = n // (c.n_heads // c.n_kv_heads)

        def proj(name, head):
          y = h @ a[name]['kernel'][:, head, :]
          return y + a[name]['bias'][head] if c.attn_bias else y

        q, k, v = proj('q', n), proj('k', kvh), proj('v', kvh)
        if c.qk_norm:
          q = _rms(q, a['q_norm']['scale'], c.norm_eps)
          k = _rms(k, a['k_norm']['scale'], c.norm_eps)
        for i in real:
          qi = _rope(q[i], pos[i], c)
          keys = [j for j in real if j <= i]
          s = np.array([qi @ _rope(k[j], pos[j], c) for j in keys]) / np.sqrt(c.head_dim)
          w = np.exp(s - s.max())
          w /= w.sum()
          o = sum(wj * v[j] for wj, j in zip(w, keys))
          attn_out[i] += o @ a['o']['kernel'][n]
      x = x + attn_out
      h = _rms(x, lp['mlp_norm']['scale'], c.norm_eps)
      m = lp['mlp']
      g = h @ m['gate']['kernel']
      x = x + (g / (1 + np.exp(-g)) * (h @ m['up']['kernel'])) @ m['down']['kernel']
    x = _rms(x, p['final_norm']['scale'], c.norm_eps)
    head = p['embed']['embedding'].T if c.tie_embeddings else p['lm_head']['kernel']
    logits[b] = x @ head
  return logits


def _forward_jit(config):
  return jax.jit(lambda params, tokens, mask, cache=None: model_lib.forward(
      params, config, tokens, model_lib.positions_from_mask(mask), mask, cache, return_hidden=True))


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_forward_matches_numpy_reference(name):
  config = CONFIGS[name]
  params = random_params(config)
  tokens, mask = padded_batch(ROWS, 8)
  got = np.asarray(_forward_jit(config)(params, tokens, mask).logits_BLV)
  want = reference_logits(params, config, np.asarray(tokens), np.asarray(mask))
  real = np.asarray(mask, bool)
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got[real], want[real], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_param_layout(name):
  c = CONFIGS[name]
  params = model_lib.init_params(c, jax.random.key(0))
  shapes = jax.tree_util.tree_map(lambda a: a.shape, params)
  D, N, K, H, F, V = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size
  attn = {
      'q': {
          'kernel': (D, N, H)
      },
      'k': {
          'kernel': (D, K, H)
      },
      'v': {
          'kernel': (D, K, H)
      },
      'o': {
          'kernel': (N, H, D)
      }
  }
  if c.attn_bias:
    for name_, heads in (('q', N), ('k', K), ('v', K)):
      attn[name_]['bias'] = (heads, H)
  if c.qk_norm:
    attn['q_norm'] = {'scale': (H,)}
    attn['k_norm'] = {'scale': (H,)}
  layer = {
      'attn_norm': {
          'scale': (D,)
      },
      'attn': attn,
      'mlp_norm': {
          'scale': (D,)
      },
      'mlp': {
          'gate': {
              'kernel': (D, F)
          },
          'up': {
              'kernel': (D, F)
          },
          'down': {
              'kernel': (F, D)
          }
      }
  }
  stacked = jax.tree_util.tree_map(lambda s: (c.n_layers,) + s, layer,
                                   is_leaf=lambda x: isinstance(x, tuple))
  want = {'embed': {'embedding': (V, D)}, 'final_norm': {'scale': (D,)}, 'layers': stacked}
  if not c.tie_embeddings:
    want['lm_head'] = {'kernel': (D, V)}
  assert shapes == want
  # init: kernels ~ N(0, 1/fan_in), norm scales 1, biases 0; every layer drawn independently.
  np.testing.assert_array_equal(params['final_norm']['scale'], 1.0)
  np.testing.assert_array_equal(params['layers']['attn_norm']['scale'], 1.0)
  if c.attn_bias:
    np.testing.assert_array_equal(params['layers']['attn']['q']['bias'], 0.0)
  down = params['layers']['mlp']['down']['kernel']
  for i in range(c.n_layers):
    std = float(jnp.std(down[i]))
    assert abs(std * np.sqrt(F) - 1) < 0.1, (i, std)
  assert c.n_layers == 1 or not np.array_equal(down[0], down[-1])
  # The earlier per-layer layout round-trips exactly.
  old = model_lib.unstack_layers(params)
  assert sorted(
      k for k in old if k.startswith('layers_')) == [f'layers_{i}' for i in range(c.n_layers)]
  assert jax.tree_util.tree_map(jnp.shape, old['layers_0']) == layer
  jax.tree_util.tree_map(np.testing.assert_array_equal, model_lib.stack_layers(old), params)
  # Every parameter has logical axes of the right rank (raises otherwise).
  model_lib.param_logical_axes(params)


@pytest.mark.parametrize('name', ['gqa_tied', 'qwen3_like_untied', 'llama3_rope'])
def test_kv_cache_decode_matches_full_forward(name):
  """Prefill 4 columns into a cache, then feed the rest one token at a time."""
  config = CONFIGS[name]
  params = random_params(config)
  tokens, mask = padded_batch(ROWS, 9)
  positions = model_lib.positions_from_mask(mask)
  fwd = _forward_jit(config)
  full = np.asarray(fwd(params, tokens, mask).logits_BLV)
  step = jax.jit(lambda params, t, p, m, cache: model_lib.forward(params, config, t, p, m, cache))
  cache = model_lib.init_cache(config, tokens.shape[0], 12)
  out = step(params, tokens[:, :4], positions[:, :4], mask[:, :4], cache)
  pieces = [out.logits_BLV]
  for i in range(4, 9):
    out = step(params, tokens[:, i:i + 1], positions[:, i:i + 1], mask[:, i:i + 1], out.cache)
    pieces.append(out.logits_BLV)
  assert int(out.cache.index) == 9
  incremental = np.asarray(jnp.concatenate(pieces, axis=1))
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(incremental[real], full[real], rtol=1e-5, atol=1e-5)


def test_left_padding_invariance():
  config = CONFIGS['qwen3_like_untied']
  params = random_params(config)
  fwd = _forward_jit(config)
  row = ROWS[0]
  outs = []
  for width in (6, 8, 13):
    tokens, mask = padded_batch([row], width, pad=5)
    outs.append(np.asarray(fwd(params, tokens, mask).logits_BLV)[0, width - len(row):])
  for other in outs[1:]:
    np.testing.assert_allclose(other, outs[0], rtol=1e-5, atol=1e-5)


def test_bfloat16_forward_close_to_float32():
  c32 = CONFIGS['qwen3_like_untied']
  c16 = dataclasses.replace(c32, param_dtype='bfloat16', dtype='bfloat16')
  params = random_params(c32)
  tokens, mask = padded_batch(ROWS, 8)
  out32 = _forward_jit(c32)(params, tokens, mask)
  params16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
  out16 = _forward_jit(c16)(params16, tokens, mask)
  assert out16.logits_BLV.dtype == jnp.float32 and out16.hidden_BLD.dtype == jnp.bfloat16
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(out16.logits_BLV[real], out32.logits_BLV[real], atol=0.15)


def _num_equations(fn, *args):
  return len(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


@pytest.mark.parametrize('remat', [False, True])
def test_program_size_does_not_grow_with_depth(remat):
  """Layers are scanned: the traced init, forward and gradient programs of a 2-layer and a
  12-layer model have the same number of top-level equations (so compile time is flat)."""
  sizes = []
  for n_layers in (2, 12):
    c = ModelConfig.tiny(vocab_size=37, n_layers=n_layers, d_model=32, n_heads=4, n_kv_heads=2,
                         head_dim=8, d_ff=48, remat=remat)
    params = jax.eval_shape(lambda c=c: model_lib.init_params(c, jax.random.key(0)))
    tokens = jnp.ones((2, 6), jnp.int32)
    loss = lambda p, c=c: jnp.sum(
        logprobs.sequence_logprobs(p, c, tokens, tokens, completion_start=3)['logps'])
    sizes.append((_num_equations(lambda k, c=c: model_lib._init_params_jit.__wrapped__(c, k),
                                 jax.random.key(0)), _num_equations(jax.grad(loss), params)))
  assert sizes[0] == sizes[1], sizes
