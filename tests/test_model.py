"""Tests for jtc.model: an independent numpy reference, KV cache, padding, chunked log-probs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import model as model_lib

ModelConfig = model_lib.ModelConfig

CONFIGS = {
    'gqa_tied': ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                 head_dim=8, d_ff=48),
    'qwen3_like_untied': ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=4,
                                          n_kv_heads=1, head_dim=8, d_ff=48, qk_norm=True,
                                          tie_embeddings=False, rope_theta=1e6),
    'qwen2_like_bias_mha': ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=2,
                                            n_kv_heads=2, head_dim=16, d_ff=48, attn_bias=True,
                                            norm_eps=1e-5),
}


def random_params(config, seed=0):
  """Random values (biases and norm scales too) in the layout of `init_params`.

  Filled with numpy from `jax.eval_shape` (tracing only, nothing compiled)."""
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name, shape = path[-1].key, leaf.shape
    if name == 'scale':
      value = 1.0 + 0.3 * rng.standard_normal(shape)
    elif name == 'bias':
      value = 0.3 * rng.standard_normal(shape)
    else:
      fan_in = {'embedding': shape[-1]}.get(name, int(np.prod(shape[:-1])) if path[-2].key == 'o'
                                                   else shape[0])
      value = rng.standard_normal(shape) / np.sqrt(fan_in)
    return jnp.asarray(value, leaf.dtype)
  return jax.tree_util.tree_map_with_path(fill, shapes)


# ----------------------------------------------------------------------------------------
# Independent reference: float64 numpy, explicit loops over batch, heads and positions.


def _rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope(x_H, pos, theta):
  H = x_H.shape[0]
  out = np.empty_like(x_H)
  for j in range(H // 2):
    angle = pos * theta ** (-2.0 * j / H)
    a, b = x_H[j], x_H[j + H // 2]
    out[j] = a * np.cos(angle) - b * np.sin(angle)
    out[j + H // 2] = b * np.cos(angle) + a * np.sin(angle)
  return out


def reference_logits(params, c, tokens_BL, mask_BL):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
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
          qi = _rope(q[i], pos[i], c.rope_theta)
          keys = [j for j in real if j <= i]
          s = np.array([qi @ _rope(k[j], pos[j], c.rope_theta) for j in keys]) / np.sqrt(
              c.head_dim)
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


def padded_batch(rows, width, pad=0):
  tokens = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    tokens[b, width - len(row):] = row
    mask[b, width - len(row):] = 1
  return jnp.asarray(tokens), jnp.asarray(mask)


ROWS = [[3, 9, 14, 2, 30, 7], [5, 1, 22], [11, 36, 0, 4, 8, 19, 25]]


def _forward_jit(config):
  return jax.jit(lambda params, tokens, mask, cache=None: model_lib.forward(
      params, config, tokens, model_lib.positions_from_mask(mask), mask, cache,
      return_hidden=True))


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
  attn = {'q': {'kernel': (D, N, H)}, 'k': {'kernel': (D, K, H)}, 'v': {'kernel': (D, K, H)},
          'o': {'kernel': (N, H, D)}}
  if c.attn_bias:
    for name_, heads in (('q', N), ('k', K), ('v', K)):
      attn[name_]['bias'] = (heads, H)
  if c.qk_norm:
    attn['q_norm'] = {'scale': (H,)}
    attn['k_norm'] = {'scale': (H,)}
  layer = {'attn_norm': {'scale': (D,)}, 'attn': attn, 'mlp_norm': {'scale': (D,)},
           'mlp': {'gate': {'kernel': (D, F)}, 'up': {'kernel': (D, F)},
                   'down': {'kernel': (F, D)}}}
  want = {'embed': {'embedding': (V, D)}, 'final_norm': {'scale': (D,)},
          **{f'layers_{i}': layer for i in range(c.n_layers)}}
  if not c.tie_embeddings:
    want['lm_head'] = {'kernel': (D, V)}
  assert shapes == want
  # init: kernels ~ N(0, 1/fan_in), norm scales 1, biases 0.
  np.testing.assert_array_equal(params['final_norm']['scale'], 1.0)
  if c.attn_bias:
    np.testing.assert_array_equal(params['layers_0']['attn']['q']['bias'], 0.0)
  std = float(jnp.std(params['layers_0']['mlp']['down']['kernel']))
  assert abs(std * np.sqrt(F) - 1) < 0.1, std
  # Every parameter has logical axes of the right rank (raises otherwise).
  model_lib.param_logical_axes(params)


@pytest.mark.parametrize('name', ['gqa_tied', 'qwen3_like_untied'])
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


def _naive_token_logprobs(hidden_BTD, head_DV, targets_BT):
  logits = jnp.einsum('BTD,DV->BTV', hidden_BTD, head_DV).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  tgt = jnp.take_along_axis(logp, targets_BT[..., None], axis=-1)[..., 0]
  return tgt, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@pytest.mark.parametrize('vocab_chunk', [7, 1000])
def test_token_logprobs_and_grads_match_naive(vocab_chunk):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(3), 4)
  B, T, D, V = 2, 5, 8, 37  # V not a multiple of the chunk: exercises the padding.
  hidden = jax.random.normal(k1, (B, T, D))
  head = 2.0 * jax.random.normal(k2, (D, V))
  targets = jax.random.randint(k3, (B, T), 0, V)
  weights = jax.random.normal(k4, (2, B, T))

  def loss(fn, hidden, head):
    logps, ent = fn(hidden, head, targets)
    return jnp.sum(weights[0] * logps) + jnp.sum(weights[1] * ent)

  chunked = lambda h, w, t: model_lib.token_logprobs(h, w, t, vocab_chunk=vocab_chunk)
  got = jax.jit(chunked)(hidden, head, targets)
  want = _naive_token_logprobs(hidden, head, targets)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  g_got = jax.jit(jax.grad(lambda h, w: loss(chunked, h, w), argnums=(0, 1)))(hidden, head)
  g_want = jax.grad(lambda h, w: loss(_naive_token_logprobs, h, w), argnums=(0, 1))(hidden, head)
  for g, w in zip(g_got, g_want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_sequence_logprobs_matches_full_logits_and_grads():
  config = CONFIGS['gqa_tied']  # tied: gradients reach the embedding through both uses
  params = random_params(config)
  P = 8
  tokens, mask = padded_batch(ROWS, P)
  completion = jnp.array([[4, 9, 1, 0], [7, 7, 2, 0], [3, 0, 0, 0]], jnp.int32)
  comp_mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], jnp.int32)
  tokens = jnp.concatenate([tokens, completion], 1)
  mask = jnp.concatenate([mask, comp_mask], 1)

  def chunked_loss(params):
    out = model_lib.sequence_logprobs(params, config, tokens, mask, completion_start=P,
                                      vocab_chunk=16, return_hidden=True)
    return jnp.sum(-out['logps'] * comp_mask) / jnp.sum(comp_mask), out

  def naive_loss(params):
    out = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask), mask,
                            return_hidden=True)
    logp = jax.nn.log_softmax(out.logits_BLV[:, P - 1:-1], axis=-1)
    logps = jnp.take_along_axis(logp, tokens[:, P:, None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.sum(-logps * comp_mask) / jnp.sum(comp_mask), (logps, ent, out.hidden_BLD)

  (l1, out), g1 = jax.jit(jax.value_and_grad(chunked_loss, has_aux=True))(params)
  (l2, (logps, ent, hidden)), g2 = jax.jit(jax.value_and_grad(naive_loss, has_aux=True))(params)
  assert out['logps'].shape == out['entropy'].shape == (3, 4)
  np.testing.assert_allclose(out['logps'], logps, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['entropy'], ent, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['hidden'], hidden[:, P - 1:-1], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                         g1, g2)


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


@pytest.mark.parametrize('field,value', [('n_kv_heads', 3), ('head_dim', 7), ('dtype', 'fp16'),
                                         ('param_dtype', 'float64'), ('d_model', 0),
                                         ('rope_theta', -1.0), ('qk_norm', 1)])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    ModelConfig.tiny(**{field: value})


@pytest.mark.parametrize('preset,non_embedding', [('qwen3_0_6b', 0.44e9), ('qwen3_1_7b', 1.4e9),
                                                  ('qwen3_8b', 6.95e9), ('llama3_1b', 0.97e9)])
def test_preset_sizes_match_model_cards(preset, non_embedding):
  """Non-embedding parameter counts as published on the model cards (within 2%)."""
  config = getattr(ModelConfig, preset)()
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
  n = model_lib.num_params(shapes) - config.vocab_size * config.d_model * (
      1 if config.tie_embeddings else 2)
  assert abs(n / non_embedding - 1) < 0.02, n


def test_tiny_and_small_presets():
  assert ModelConfig.tiny().vocab_size == 64 and ModelConfig.tiny(vocab_size=100).vocab_size == 100
  shapes = jax.eval_shape(lambda: model_lib.init_params(ModelConfig.small_25m(),
                                                        jax.random.key(0)))
  assert 22e6 < model_lib.num_params(shapes) < 28e6
