"""Decoder-only Transformer of the Llama / Qwen2 / Qwen3 family: layers scanned over stacked
parameters, an explicit KV cache, and a decode step that reads only what it needs.

One set of pure functions covers the three architectures:
  * RMSNorm (Llama/Qwen: ``x * rsqrt(mean(x^2) + eps) * scale``, computed in float32);
  * rotary position embeddings in the Hugging Face "rotate_half" layout (first half / second
    half of the head dimension, not interleaved), so Hugging Face weights load unpermuted,
    with optional frequency scaling (``rope_scaling='linear'`` or Llama-3.1/3.2 ``'llama3'``);
  * grouped-query attention (``n_kv_heads`` divides ``n_heads``);
  * optional RMSNorm over the head dimension of q and k before RoPE (Qwen3 ``qk_norm``);
  * optional q/k/v biases (Qwen2 ``attn_bias``);
  * SwiGLU MLP ``down(silu(gate(x)) * up(x))``;
  * tied or untied output embeddings.

The layers share one structure, so their parameters are stacked on a leading axis of size
Y = n_layers and the trunk is one `jax.lax.scan` over them (as maxtext's ``scan_layers``): the
compiled program, its compile time and `init_params` do not grow with depth. The parameter
pytree (what `init_params` returns, what `jtc.hf_import` fills) is::

  {'embed': {'embedding': [V, D]},
   'layers': {'attn_norm': {'scale': [Y, D]},
              'attn': {'q': {'kernel': [Y, D, N, H], 'bias': [Y, N, H]},   # bias iff attn_bias
                       'k': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'v': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'o': {'kernel': [Y, N, H, D]},
                       'q_norm': {'scale': [Y, H]}, 'k_norm': {'scale': [Y, H]}},  # iff qk_norm
              'mlp_norm': {'scale': [Y, D]},
              'mlp': {'gate': {'kernel': [Y, D, F]}, 'up': {'kernel': [Y, D, F]},
                      'down': {'kernel': [Y, F, D]}}},
   'final_norm': {'scale': [D]},
   'lm_head': {'kernel': [D, V]}}                                    # absent iff tie_embeddings

Layer i is ``jax.tree.map(lambda x: x[i], params['layers'])``. The earlier per-layer layout
(``'layers_0'``, ``'layers_1'``, ...) converts both ways with `stack_layers` / `unstack_layers`.

Two caches, both pytrees passed in and returned:
  * `KVCache` (general): keys/values [Y, B, K, S, H] for S slots; all sequences share one slot
    counter ``index`` (prompts are left-padded) and ``mask_BS`` records which slots hold real
    tokens. Query slot ``index + l`` may see key slot ``s`` iff ``mask_BS[b, s]`` and
    ``s <= index + l``.
  * `GroupCache` (sampling): the prompt's keys/values ONCE per prompt [Y, B, K, P, H], shared by
    its G samples, plus each sample's own completion keys/values [Y, B*G, K, ...]. `decode_step`
    attends from the G rows of a group to the shared prompt block (one read per prompt) and to
    the live prefix of their own completion cache, in fixed-size blocks up to the current
    length (a `jax.lax.fori_loop`), combining the parts with an online softmax.

Dimension key:
  B batch (prompts), G samples per prompt, R = B * G rows, L tokens in this call, S cache slots,
  P prompt length, T completion length, Y layers, N query heads, K kv heads,
  Q query heads per kv head (N = K * Q), H head dim, D model dim, F mlp dim, V vocab,
  C vocab chunk / cache block, n number of chunks.
"""

import dataclasses
import functools
import math
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
_MASKED = -1e30  # finite "minus infinity": a fully masked row softmaxes to uniform, not NaN.
ROPE_SCALINGS = ('default', 'linear', 'llama3')


# ----------------------------------------------------------------------------------------
# Configuration.


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters; `tiny()` is the default for a 2-core CPU."""
  vocab_size: int = 64
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 32
  d_ff: int = 384
  rope_theta: float = 10_000.0
  # RoPE frequency scaling (Hugging Face `rope_scaling` / `rope_parameters`):
  #   'default': angle_j = pos * theta^(-2j/H);
  #   'linear':  every frequency divided by rope_factor (positions interpolated);
  #   'llama3':  Llama-3.1/3.2: with wavelength w_j = 2 pi / f_j and
  #              s_j = clip((rope_original_max_len / w_j - low) / (high - low), 0, 1),
  #              f_j <- (1 - s_j) f_j / rope_factor + s_j f_j (low/high = rope_*_freq_factor):
  #              short wavelengths kept, long ones divided by the factor, a blend between.
  rope_scaling: str = 'default'
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  norm_eps: float = 1e-6
  qk_norm: bool = False
  attn_bias: bool = False
  tie_embeddings: bool = True
  param_dtype: str = 'float32'
  dtype: str = 'float32'
  max_seq_len: int = 2048
  # Rematerialise each block's activations in the backward pass (jax.checkpoint around the
  # scanned block): memory O(n_layers * B L D) instead of O(n_layers * B L (D + F + N S)),
  # for about one extra forward pass. Same parameters, same values, same gradients.
  remat: bool = False

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'n_layers', 'n_heads', 'n_kv_heads', 'head_dim',
                 'd_ff', 'max_seq_len', 'rope_original_max_len'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f'ModelConfig.{name} must be a positive int, got {value!r}')
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f'ModelConfig.n_heads={self.n_heads} must be divisible by '
                       f'ModelConfig.n_kv_heads={self.n_kv_heads}')
    if self.head_dim % 2:
      raise ValueError(f'ModelConfig.head_dim={self.head_dim} must be even for RoPE')
    if not self.rope_theta > 0:
      raise ValueError(f'ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}')
    if self.rope_scaling not in ROPE_SCALINGS:
      raise ValueError(f'ModelConfig.rope_scaling={self.rope_scaling!r} is not one of '
                       f'{list(ROPE_SCALINGS)}')
    if not self.rope_factor > 0:
      raise ValueError(f'ModelConfig.rope_factor must be > 0, got {self.rope_factor!r}')
    if self.rope_scaling == 'llama3' and not (
        0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      raise ValueError(
          'ModelConfig.rope_low_freq_factor and rope_high_freq_factor must satisfy '
          f'0 < low < high for llama3 RoPE, got {self.rope_low_freq_factor!r}, '
          f'{self.rope_high_freq_factor!r}')
    if not self.norm_eps > 0:
      raise ValueError(f'ModelConfig.norm_eps must be > 0, got {self.norm_eps!r}')
    for name in ('param_dtype', 'dtype'):
      value = getattr(self, name)
      if value not in _DTYPES:
        raise ValueError(f'ModelConfig.{name}={value!r} is not one of {sorted(_DTYPES)}')
    for name in ('qk_norm', 'attn_bias', 'tie_embeddings', 'remat'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'ModelConfig.{name} must be a bool, got {getattr(self, name)!r}')

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @classmethod
  def tiny(cls, vocab_size: int = 64, **overrides) -> 'ModelConfig':
    """About 0.8M parameters (+ V * 128): 4 layers, d_model 128, 4 heads, 2 kv heads."""
    return cls(**{**dict(vocab_size=vocab_size, d_model=128, n_layers=4, n_heads=4,
                         n_kv_heads=2, head_dim=32, d_ff=384, max_seq_len=2048), **overrides})

  @classmethod
  def small_25m(cls, **overrides) -> 'ModelConfig':
    """26.2M parameters (7 x 3.15M layers + tied 8192 x 512 embedding): the benchmark size."""
    return cls(**{**dict(vocab_size=8192, d_model=512, n_layers=7, n_heads=8, n_kv_heads=4,
                         head_dim=64, d_ff=1536, max_seq_len=4096), **overrides})

  @classmethod
  def qwen3_0_6b(cls, **overrides) -> 'ModelConfig':
    return cls(**{**dict(vocab_size=151_936, d_model=1024, n_layers=28, n_heads=16,
                         n_kv_heads=8, head_dim=128, d_ff=3072, rope_theta=1_000_000.0,
                         norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=True,
                         param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
                  **overrides})

  @classmethod
  def qwen3_1_7b(cls, **overrides) -> 'ModelConfig':
    return cls(**{**dict(vocab_size=151_936, d_model=2048, n_layers=28, n_heads=16,
                         n_kv_heads=8, head_dim=128, d_ff=6144, rope_theta=1_000_000.0,
                         norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=True,
                         param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
                  **overrides})

  @classmethod
  def qwen3_8b(cls, **overrides) -> 'ModelConfig':
    return cls(**{**dict(vocab_size=151_936, d_model=4096, n_layers=36, n_heads=32,
                         n_kv_heads=8, head_dim=128, d_ff=12_288, rope_theta=1_000_000.0,
                         norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False,
                         param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
                  **overrides})

  @classmethod
  def llama3_1b(cls, **overrides) -> 'ModelConfig':
    """Llama-3.2-1B sizes, including its "llama3" RoPE frequency scaling (factor 32)."""
    return cls(**{**dict(vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32,
                         n_kv_heads=8, head_dim=64, d_ff=8192, rope_theta=500_000.0,
                         rope_scaling='llama3', rope_factor=32.0, rope_low_freq_factor=1.0,
                         rope_high_freq_factor=4.0, rope_original_max_len=8192,
                         norm_eps=1e-5, qk_norm=False, attn_bias=False, tie_embeddings=True,
                         param_dtype='bfloat16', dtype='bfloat16', max_seq_len=131_072),
                  **overrides})


def num_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


# ----------------------------------------------------------------------------------------
# Parameters: initialisation (one layer's initialiser, vmapped over the Y layers) and the
# conversion from the earlier per-layer layout.


def _normal(key, shape, fan_in, dtype):
  """N(0, 1/fan_in) in `dtype`."""
  return jax.random.normal(key, shape, dtype) * jnp.asarray(1.0 / math.sqrt(fan_in), dtype)


def _init_layer(config: ModelConfig, key) -> dict:
  """One block's parameters (no layer axis): kernels ~ N(0, 1/fan_in), scales 1, biases 0."""
  c = config
  D, N, K, H, F = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
  dt = c.jnp_param_dtype
  kq, kk, kv, ko, kg, ku, kd = jax.random.split(key, 7)
  attn = {'q': {'kernel': _normal(kq, (D, N, H), D, dt)},
          'k': {'kernel': _normal(kk, (D, K, H), D, dt)},
          'v': {'kernel': _normal(kv, (D, K, H), D, dt)},
          'o': {'kernel': _normal(ko, (N, H, D), N * H, dt)}}
  if c.attn_bias:
    for name, heads in (('q', N), ('k', K), ('v', K)):
      attn[name]['bias'] = jnp.zeros((heads, H), dt)
  if c.qk_norm:
    attn['q_norm'] = {'scale': jnp.ones((H,), dt)}
    attn['k_norm'] = {'scale': jnp.ones((H,), dt)}
  return {'attn_norm': {'scale': jnp.ones((D,), dt)}, 'attn': attn,
          'mlp_norm': {'scale': jnp.ones((D,), dt)},
          'mlp': {'gate': {'kernel': _normal(kg, (D, F), D, dt)},
                  'up': {'kernel': _normal(ku, (D, F), D, dt)},
                  'down': {'kernel': _normal(kd, (F, D), F, dt)}}}


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(config: ModelConfig, rng: jax.Array) -> dict:
  c = config
  k_embed, k_layers, k_head = jax.random.split(rng, 3)
  params = {
      'embed': {'embedding': _normal(k_embed, (c.vocab_size, c.d_model), c.d_model,
                                     c.jnp_param_dtype)},
      'layers': jax.vmap(functools.partial(_init_layer, c))(
          jax.random.split(k_layers, c.n_layers)),
      'final_norm': {'scale': jnp.ones((c.d_model,), c.jnp_param_dtype)}}
  if not c.tie_embeddings:
    params['lm_head'] = {'kernel': _normal(k_head, (c.d_model, c.vocab_size), c.d_model,
                                           c.jnp_param_dtype)}
  return params


def init_params(config: ModelConfig, rng: jax.Array) -> dict:
  """Random parameters in the layout documented at the top of this module.

  Kernels ~ N(0, 1/fan_in), embedding ~ N(0, 1/D), norm scales 1, biases 0. One layer's
  initialiser is traced and vmapped over the Y layers, so the cost does not grow with depth.
  """
  return _init_params_jit(config, rng)


def _layer_names(params) -> list:
  names = [k for k in params if k.startswith('layers_')]
  return sorted(names, key=lambda k: int(k.split('_', 1)[1]))


def stack_layers(params: dict) -> dict:
  """Earlier per-layer layout {'layers_0': {...}, ..., 'layers_{Y-1}': {...}} -> 'layers'
  stacked on a leading axis (values unchanged); stacked params are returned as they are.

  Works on numpy or jax arrays (numpy stays numpy: nothing is put on a device)."""
  names = _layer_names(params)
  if not names:
    return params
  if 'layers' in params:
    raise ValueError(f'params have both stacked "layers" and per-layer {names[:2]}...')
  if names != [f'layers_{i}' for i in range(len(names))]:
    raise ValueError(f'per-layer params must be layers_0 .. layers_{len(names) - 1}, got {names}')
  stack = lambda *xs: (np.stack if isinstance(xs[0], np.ndarray) else jnp.stack)(xs)
  out = {k: v for k, v in params.items() if k not in names}
  out['layers'] = jax.tree_util.tree_map(stack, *[params[n] for n in names])
  return out


def unstack_layers(params: dict) -> dict:
  """Inverse of `stack_layers`: 'layers' [Y, ...] -> {'layers_0': ..., 'layers_{Y-1}': ...}."""
  if 'layers' not in params:
    return params
  Y = jax.tree_util.tree_leaves(params['layers'])[0].shape[0]
  out = {k: v for k, v in params.items() if k != 'layers'}
  for i in range(Y):
    out[f'layers_{i}'] = jax.tree_util.tree_map(lambda x, i=i: x[i], params['layers'])
  return out


# ----------------------------------------------------------------------------------------
# Caches.


@flax.struct.dataclass
class KVCache:
  """Keys/values (RoPE already applied) of every layer for S slots.

  Attributes:
    k: [Y, B, K, S, H] in the compute dtype.
    v: [Y, B, K, S, H].
    mask_BS: [B, S] bool, True where a slot holds a real (non-pad) token.
    index: [] int32, the next slot to write (shared by the whole batch).
  """
  k: jax.Array
  v: jax.Array
  mask_BS: jax.Array
  index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, cache_len: int) -> KVCache:
  """An empty cache of `cache_len` slots."""
  shape = (config.n_layers, batch_size, config.n_kv_heads, cache_len, config.head_dim)
  return KVCache(k=jnp.zeros(shape, config.jnp_dtype), v=jnp.zeros(shape, config.jnp_dtype),
                 mask_BS=jnp.zeros((batch_size, cache_len), bool),
                 index=jnp.zeros((), jnp.int32))


@flax.struct.dataclass
class GroupCache:
  """The sampler's cache: one prompt block per prompt, one completion block per sample.

  Rows b*G .. b*G + G - 1 are the G samples of prompt b; they all read prompt b's block.

  Attributes:
    prompt_k, prompt_v: [Y, B, K, P, H] keys/values of the (left-padded) prompts.
    prompt_mask_BP: [B, P] bool, True on real prompt tokens.
    k: [Y, R, K, H, T'] completion keys, stored transposed (the slots of a block contiguous),
      T' = T rounded up to whole blocks.
    v: [Y, R, K, T', H] completion values.
    length: [] int32, completion slots written so far (the next one to write).
  """
  prompt_k: jax.Array
  prompt_v: jax.Array
  prompt_mask_BP: jax.Array
  k: jax.Array
  v: jax.Array
  length: jax.Array

  @property
  def group_size(self) -> int:
    return self.k.shape[1] // self.prompt_k.shape[1]


# ----------------------------------------------------------------------------------------
# Layer pieces (pure functions of one layer's parameters).


def rms_norm(x, scale, eps: float, dtype):
  """y = x * rsqrt(mean(x^2) + eps) * scale, in float32, cast to `dtype`."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(dtype)


def _dense(eqn, x, p, dtype):
  """einsum(eqn, x, kernel) (+ bias) in the compute dtype."""
  y = jnp.einsum(eqn, x.astype(dtype), p['kernel'].astype(dtype))
  if 'bias' in p:
    y = y + p['bias'].astype(dtype)
  return y


def rope_inv_freq(config: ModelConfig):
  """Inverse frequencies f_j [H/2] float32 of the rotate_half RoPE, scaled per
  `config.rope_scaling` (see `ModelConfig`)."""
  c = config
  inv_freq = c.rope_theta ** (-jnp.arange(0, c.head_dim, 2, dtype=jnp.float32) / c.head_dim)
  if c.rope_scaling == 'linear':
    inv_freq = inv_freq / c.rope_factor
  elif c.rope_scaling == 'llama3':
    # Blend weight 1 keeps a frequency, 0 divides it by the factor; it is linear in the number
    # of wavelengths that fit in the original context, between the low and high thresholds.
    wavelengths = 2 * math.pi / inv_freq
    blend = jnp.clip((c.rope_original_max_len / wavelengths - c.rope_low_freq_factor)
                     / (c.rope_high_freq_factor - c.rope_low_freq_factor), 0.0, 1.0)
    inv_freq = (1 - blend) * inv_freq / c.rope_factor + blend * inv_freq
  return inv_freq


def rope_sin_cos(positions_BL, config: ModelConfig):
  """sin/cos [B, L, H] for the rotate_half layout: angle_j = pos * f_j, j < H/2, repeated."""
  angles = positions_BL.astype(jnp.float32)[..., None] * rope_inv_freq(config)  # [B, L, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BLNH, sin_BLH, cos_BLH):
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of H), in float32."""
  x = x_BLNH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]
  return out.astype(x_BLNH.dtype)


def _qkv(attn, x_BLD, sin_BLH, cos_BLH, config: ModelConfig):
  """Projections of the normed input: q [B, L, N, H], k and v [B, L, K, H] (RoPE on q, k)."""
  c = config
  q_BLNH = _dense('BLD,DNH->BLNH', x_BLD, attn['q'], c.jnp_dtype)
  k_BLKH = _dense('BLD,DKH->BLKH', x_BLD, attn['k'], c.jnp_dtype)
  v_BLKH = _dense('BLD,DKH->BLKH', x_BLD, attn['v'], c.jnp_dtype)
  if c.qk_norm:
    q_BLNH = rms_norm(q_BLNH, attn['q_norm']['scale'], c.norm_eps, c.jnp_dtype)
    k_BLKH = rms_norm(k_BLKH, attn['k_norm']['scale'], c.norm_eps, c.jnp_dtype)
  return apply_rope(q_BLNH, sin_BLH, cos_BLH), apply_rope(k_BLKH, sin_BLH, cos_BLH), v_BLKH


def _mlp(mlp, x_BLD, config: ModelConfig):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  dt = config.jnp_dtype
  gate_BLF = _dense('BLD,DF->BLF', x_BLD, mlp['gate'], dt)
  up_BLF = _dense('BLD,DF->BLF', x_BLD, mlp['up'], dt)
  return _dense('BLF,FD->BLD', jax.nn.silu(gate_BLF) * up_BLF, mlp['down'], dt)


def _softmax_attention(q_BLNH, k_BKSH, v_BKSH, allowed_BLS, config: ModelConfig):
  """softmax(q k^T / sqrt(H) masked to `allowed`) v over S key slots: [B, L, N, H]."""
  c = config
  B, L, N, H = q_BLNH.shape
  K = k_BKSH.shape[1]
  q_BLKQH = q_BLNH.reshape(B, L, K, N // K, H)
  scores_BKQLS = jnp.einsum('BLKQH,BKSH->BKQLS', q_BLKQH, k_BKSH.astype(c.jnp_dtype),
                            preferred_element_type=jnp.float32) / math.sqrt(H)
  scores_BKQLS = jnp.where(allowed_BLS[:, None, None], scores_BKQLS, _MASKED)
  probs_BKQLS = jax.nn.softmax(scores_BKQLS, axis=-1).astype(c.jnp_dtype)
  out_BLKQH = jnp.einsum('BKQLS,BKSH->BLKQH', probs_BKQLS, v_BKSH.astype(c.jnp_dtype))
  return out_BLKQH.reshape(B, L, N, H)


def _block(layer, x_BLD, sin_BLH, cos_BLH, attend, config: ModelConfig):
  """Pre-norm residual block: x += o(attend(q, k, v)); x += mlp(norm(x)).

  `attend(q_BLNH, k_BLKH, v_BLKH) -> (out_BLNH, aux)` is the attention of this call (plain
  causal, through a `KVCache`, or grouped decode); `aux` is returned beside the new x.
  """
  c = config
  h_BLD = rms_norm(x_BLD, layer['attn_norm']['scale'], c.norm_eps, c.jnp_dtype)
  q_BLNH, k_BLKH, v_BLKH = _qkv(layer['attn'], h_BLD, sin_BLH, cos_BLH, c)
  out_BLNH, aux = attend(q_BLNH, k_BLKH, v_BLKH)
  x_BLD = x_BLD + _dense('BLNH,NHD->BLD', out_BLNH, layer['attn']['o'], c.jnp_dtype)
  h_BLD = rms_norm(x_BLD, layer['mlp_norm']['scale'], c.norm_eps, c.jnp_dtype)
  return x_BLD + _mlp(layer['mlp'], h_BLD, c), aux


def _embed(params, tokens_BL, config: ModelConfig):
  return jnp.take(params['embed']['embedding'], tokens_BL, axis=0).astype(config.jnp_dtype)


def _final_norm(params, x_BLD, config: ModelConfig):
  return rms_norm(x_BLD, params['final_norm']['scale'], config.norm_eps, config.jnp_dtype)


def _to_BKLH(x_BLKH):
  return x_BLKH.transpose(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------
# The trunk: one scan over the stacked layers.


def _trunk_no_cache(params, config: ModelConfig, x_BLD, sin_BLH, cos_BLH, mask_BL, *,
                    return_kv: bool = False):
  """Causal attention over the L tokens themselves (real keys only).

  Returns (x_BLD, kv) where kv is None or the keys/values of every layer, each
  [Y, B, K, L, H] (a prompt cache, when `return_kv`)."""
  c = config
  L = x_BLD.shape[1]
  allowed_BLS = mask_BL.astype(bool)[:, None, :] & jnp.tril(jnp.ones((L, L), bool))[None]

  def attend(q_BLNH, k_BLKH, v_BLKH):
    out_BLNH = _softmax_attention(q_BLNH, _to_BKLH(k_BLKH), _to_BKLH(v_BLKH), allowed_BLS, c)
    return out_BLNH, ((_to_BKLH(k_BLKH), _to_BKLH(v_BLKH)) if return_kv else None)

  def body(x_BLD, layer):
    return _block(layer, x_BLD, sin_BLH, cos_BLH, attend, c)

  if c.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  return jax.lax.scan(body, x_BLD, params['layers'])


def _trunk_with_cache(params, config: ModelConfig, x_BLD, sin_BLH, cos_BLH, mask_BL,
                      cache: KVCache):
  """Writes the L new tokens at slots index .. index + L - 1 and attends over the cache."""
  c = config
  L = x_BLD.shape[1]
  index = cache.index
  key_mask_BS = jax.lax.dynamic_update_slice(cache.mask_BS, mask_BL.astype(bool), (0, index))
  S = key_mask_BS.shape[1]
  causal_LS = jnp.arange(S)[None, :] <= (index + jnp.arange(L))[:, None]
  allowed_BLS = key_mask_BS[:, None, :] & causal_LS[None]

  def body(x_BLD, xs):
    layer, k_BKSH, v_BKSH = xs

    def attend(q_BLNH, k_BLKH, v_BLKH):
      k_new = jax.lax.dynamic_update_slice(k_BKSH, _to_BKLH(k_BLKH).astype(k_BKSH.dtype),
                                           (0, 0, index, 0))
      v_new = jax.lax.dynamic_update_slice(v_BKSH, _to_BKLH(v_BLKH).astype(v_BKSH.dtype),
                                           (0, 0, index, 0))
      return _softmax_attention(q_BLNH, k_new, v_new, allowed_BLS, c), (k_new, v_new)

    return _block(layer, x_BLD, sin_BLH, cos_BLH, attend, c)

  x_BLD, (k, v) = jax.lax.scan(body, x_BLD, (params['layers'], cache.k, cache.v))
  return x_BLD, KVCache(k=k, v=v, mask_BS=key_mask_BS, index=index + L)


def hidden_states(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
                  cache: KVCache | None = None):
  """The trunk only: (final-normed hidden [B, L, D], cache or None). No LM head."""
  chex.assert_rank([tokens_BL, positions_BL, mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, positions_BL, mask_BL])
  sin_BLH, cos_BLH = rope_sin_cos(positions_BL, config)
  x_BLD = _embed(params, tokens_BL, config)
  if cache is None:
    x_BLD, _ = _trunk_no_cache(params, config, x_BLD, sin_BLH, cos_BLH, mask_BL)
  else:
    x_BLD, cache = _trunk_with_cache(params, config, x_BLD, sin_BLH, cos_BLH, mask_BL, cache)
  return _final_norm(params, x_BLD, config), cache


def positions_from_mask(mask_BL):
  """Position of each token among the real ones: cumsum(mask) - 1, clipped at 0 (pads)."""
  return jnp.maximum(jnp.cumsum(mask_BL.astype(jnp.int32), axis=-1) - 1, 0)


def lm_head_DV(params, config: ModelConfig):
  """The output projection [D, V]: embedding^T when tied, else lm_head/kernel."""
  if config.tie_embeddings:
    return params['embed']['embedding'].T
  return params['lm_head']['kernel']


def _logits(params, config: ModelConfig, hidden_BLD):
  """float32 logits [B, L, V] of final-normed hidden states."""
  head_DV = lm_head_DV(params, config)
  return jnp.einsum('BLD,DV->BLV', hidden_BLD, head_DV.astype(hidden_BLD.dtype),
                    preferred_element_type=jnp.float32)


@flax.struct.dataclass
class ForwardOutput:
  """logits_BLV float32 [B, L, V]; hidden_BLD [B, L, D] final-normed (None unless asked);
  cache the updated `KVCache` (None if none was passed)."""
  logits_BLV: jax.Array
  hidden_BLD: jax.Array | None
  cache: KVCache | None


def forward(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
            cache: KVCache | None = None, *, return_hidden: bool = False) -> ForwardOutput:
  """Run the Transformer on L new tokens.

  Args:
    params: parameter pytree (module docstring).
    config: static `ModelConfig`.
    tokens_BL: [B, L] int token ids.
    positions_BL: [B, L] int RoPE positions (e.g. `positions_from_mask(mask_BL)`).
    mask_BL: [B, L] 1 for real tokens, 0 for pads (pads are never attended to).
    cache: optional `KVCache`; the new tokens are written at slots
      ``cache.index .. cache.index + L - 1`` and attend causally to every real slot up to
      their own. Without a cache attention is causal over the L tokens themselves.
    return_hidden: also return the final-normed hidden states.

  Returns:
    `ForwardOutput(logits_BLV float32, hidden_BLD or None, cache or None)`.
  """
  hidden_BLD, cache = hidden_states(params, config, tokens_BL, positions_BL, mask_BL, cache)
  return ForwardOutput(logits_BLV=_logits(params, config, hidden_BLD),
                       hidden_BLD=hidden_BLD if return_hidden else None, cache=cache)


# ----------------------------------------------------------------------------------------
# Sampling: prefill once per prompt, then decode steps against a `GroupCache`.


def prefill(params, config: ModelConfig, prompt_tokens_BP, prompt_mask_BP, *,
            num_samples: int, max_new_tokens: int, block_size: int = 128):
  """Runs the left-padded prompts once and builds the sampler's `GroupCache`.

  Args:
    prompt_tokens_BP: [B, P] int prompts, LEFT-padded.
    prompt_mask_BP: [B, P] 1 on real prompt tokens.
    num_samples: G rows per prompt in the completion cache.
    max_new_tokens: T completion slots (rounded up to whole blocks of `block_size`).
    block_size: C, completion slots per attention block in `decode_step`.

  Returns:
    (logits_BV float32 of the token after each prompt, an empty-completion `GroupCache`).
  """
  c = config
  B, P = prompt_tokens_BP.shape
  C = min(block_size, max_new_tokens)
  T_pad = -(-max_new_tokens // C) * C
  sin_BLH, cos_BLH = rope_sin_cos(positions_from_mask(prompt_mask_BP), c)
  x_BPD, (k_YBKPH, v_YBKPH) = _trunk_no_cache(
      params, dataclasses.replace(c, remat=False), _embed(params, prompt_tokens_BP, c),
      sin_BLH, cos_BLH, prompt_mask_BP, return_kv=True)
  # Prompts are left-padded, so the last column predicts the first new token; only its
  # logits are computed (never [B, P, V]).
  logits_BV = _logits(params, c, _final_norm(params, x_BPD[:, -1:], c))[:, 0]
  Y, R, K, H = c.n_layers, B * num_samples, c.n_kv_heads, c.head_dim
  cache = GroupCache(prompt_k=k_YBKPH.astype(c.jnp_dtype), prompt_v=v_YBKPH.astype(c.jnp_dtype),
                     prompt_mask_BP=prompt_mask_BP.astype(bool),
                     k=jnp.zeros((Y, R, K, H, T_pad), c.jnp_dtype),
                     v=jnp.zeros((Y, R, K, T_pad, H), c.jnp_dtype),
                     length=jnp.zeros((), jnp.int32))
  return logits_BV, cache


def _online_update(state, scores_RKQC, v_RKCH):
  """One block of an online softmax: running max m, sum l and un-normalised output o.

  p v is an elementwise product summed over the block (float32): for one query per row it is
  a batched matrix-vector product, which XLA fuses into one pass over the block."""
  m_RKQ, l_RKQ, o_RKQH = state
  new_m_RKQ = jnp.maximum(m_RKQ, jnp.max(scores_RKQC, axis=-1))
  decay_RKQ = jnp.exp(m_RKQ - new_m_RKQ)
  p_RKQC = jnp.exp(scores_RKQC - new_m_RKQ[..., None])
  l_RKQ = l_RKQ * decay_RKQ + jnp.sum(p_RKQC, axis=-1)
  pv_RKQH = jnp.sum(p_RKQC[..., None] * v_RKCH[:, :, None].astype(jnp.float32), axis=-2)
  return new_m_RKQ, l_RKQ, o_RKQH * decay_RKQ[..., None] + pv_RKQH


def _group_attention(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP, read_block, length,
                     block_size, config: ModelConfig):
  """One query per row against its prompt's block plus its own live completion prefix.

  `read_block(start) -> (kt_RKHC, v_RKCH)` reads completion slots start .. start + C - 1 of
  this layer (keys transposed, see `GroupCache`).

  Part 1: the G rows of prompt b read prompt b's keys once ([B, K, G*Q, P] scores).
  Part 2: the row's completion slots 0 .. length (inclusive: the new token is written
  already), in blocks of C slots, block j for j <= length // C only. The two parts are
  merged with the log-sum-exp identity softmax([a, b]) = [e^a, e^b] / (sum e^a + sum e^b).

  Returns out_R1NH in the compute dtype.
  """
  c = config
  R, _, N, H = q_R1NH.shape
  B, K, P, _ = prompt_k_BKPH.shape
  G, Q = R // B, N // K
  C = block_size
  scale = 1.0 / math.sqrt(H)
  dt = c.jnp_dtype

  q_BGKQH = q_R1NH.reshape(B, G, K, Q, H)
  scores_BKGQP = jnp.einsum('BGKQH,BKPH->BKGQP', q_BGKQH, prompt_k_BKPH.astype(dt),
                            preferred_element_type=jnp.float32) * scale
  scores_BKGQP = jnp.where(prompt_mask_BP[:, None, None, None, :], scores_BKGQP, _MASKED)
  m1_BKGQ = jnp.max(scores_BKGQP, axis=-1)
  p_BKGQP = jnp.exp(scores_BKGQP - m1_BKGQ[..., None])
  l1_BKGQ = jnp.sum(p_BKGQP, axis=-1)
  o1_BGKQH = jnp.einsum('BKGQP,BKPH->BGKQH', p_BKGQP.astype(dt), prompt_v_BKPH.astype(dt),
                        preferred_element_type=jnp.float32)
  to_rows = lambda x_BKGQ: x_BKGQ.transpose(0, 2, 1, 3).reshape(R, K, Q)
  m1_RKQ, l1_RKQ = to_rows(m1_BKGQ), to_rows(l1_BKGQ)
  o1_RKQH = o1_BGKQH.reshape(R, K, Q, H)

  q_RKQH = q_R1NH.reshape(R, K, Q, H)

  def block(j, state):
    start = j * C
    kt_RKHC, v_RKCH = read_block(start)
    # q . k as a product summed over H: keys are stored [.., H, T] so that the C slots of a
    # block are contiguous for every (row, head, h) and the sum vectorises over them.
    scores_RKQC = jnp.sum(q_RKQH[..., None].astype(jnp.float32)
                          * kt_RKHC[:, :, None].astype(jnp.float32), axis=-2) * scale
    live_C = start + jnp.arange(C) <= length
    scores_RKQC = jnp.where(live_C, scores_RKQC, _MASKED)
    return _online_update(state, scores_RKQC, v_RKCH)

  init = (jnp.full((R, K, Q), _MASKED, jnp.float32), jnp.zeros((R, K, Q), jnp.float32),
          jnp.zeros((R, K, Q, H), jnp.float32))
  m2_RKQ, l2_RKQ, o2_RKQH = jax.lax.fori_loop(0, length // C + 1, block, init)

  m_RKQ = jnp.maximum(m1_RKQ, m2_RKQ)
  w1_RKQ, w2_RKQ = jnp.exp(m1_RKQ - m_RKQ), jnp.exp(m2_RKQ - m_RKQ)
  out_RKQH = ((o1_RKQH * w1_RKQ[..., None] + o2_RKQH * w2_RKQ[..., None])
              / (l1_RKQ * w1_RKQ + l2_RKQ * w2_RKQ)[..., None])
  return out_RKQH.reshape(R, 1, N, H).astype(dt)


def split_layers(params) -> dict:
  """`params` with 'layers' as a tuple of Y per-layer trees (slices of the stacked arrays).

  Made once, outside a decode loop, this lets `decode_step` run its layers as a Python loop
  over separate arrays: on XLA:CPU a dynamic slice of a stacked weight that feeds a matmul is
  copied every step, which a decode step (bandwidth-bound) pays for in full."""
  Y = jax.tree_util.tree_leaves(params['layers'])[0].shape[0]
  return {**params, 'layers': tuple(jax.tree_util.tree_map(lambda x, i=i: x[i], params['layers'])
                                    for i in range(Y))}


def split_cache(cache: GroupCache) -> GroupCache:
  """The same cache with prompt_k/prompt_v/k/v as tuples of Y per-layer arrays (the layout
  `decode_step` uses with `split_layers` params: each layer writes and reads its own buffers)."""
  split = lambda x: tuple(x[i] for i in range(x.shape[0]))
  return cache.replace(prompt_k=split(cache.prompt_k), prompt_v=split(cache.prompt_v),
                       k=split(cache.k), v=split(cache.v))


def decode_step(params, config: ModelConfig, tokens_R, positions_R, cache: GroupCache, *,
                block_size: int = 128):
  """One new token per row: written at completion slot `cache.length`, attending to the
  row's prompt (shared by its group) and to its completion slots 0 .. length.

  Args:
    params: parameters with stacked 'layers' (one `jax.lax.scan` over the layers: compile time
      flat in depth), or with 'layers' from `split_layers` together with a `split_cache`
      cache (a Python loop over per-layer arrays: no per-step weight copies on XLA:CPU,
      compile time linear in depth).
    tokens_R: [R] int, the token each row feeds (R = B * G, groups contiguous).
    positions_R: [R] int RoPE positions of those tokens.
    cache: the `GroupCache` from `prefill` (or a previous step).
    block_size: C, completion slots per attention block (as in `prefill`).

  Returns:
    (logits_RV float32 of the next token, the cache with length + 1).
  """
  c = config
  per_layer = isinstance(params['layers'], (tuple, list))
  if per_layer != isinstance(cache.k, (tuple, list)):
    raise ValueError('decode_step: split_layers(params) goes with split_cache(cache), and '
                     'stacked params with a stacked cache')
  C = min(block_size, cache.v[0].shape[-2])  # v: [(Y,) R, K, T', H]
  t = cache.length
  sin_BLH, cos_BLH = rope_sin_cos(positions_R[:, None], c)
  x_R1D = _embed(params, tokens_R[:, None], c)

  def layer_step(x_R1D, layer, prompt_k_BKPH, prompt_v_BKPH, k_cache, v_cache, i):
    """One block; `k_cache`, `v_cache` are this layer's ([R, K, H, T'], [R, K, T', H]) or, with
    a layer index `i`, the stacked ([Y, ...]) completion caches. The new key/value go to slot
    t first, then blocks of C slots are read from the updated buffers."""
    lead = () if i is None else (i,)

    def read(kv, start):
      kt, v = kv
      kt = jax.lax.dynamic_slice(kt, lead + (0, 0, 0, start), (1,) * len(lead) + kt.shape[
          len(lead):-1] + (C,))
      v = jax.lax.dynamic_slice(v, lead + (0, 0, start, 0), (1,) * len(lead) + v.shape[
          len(lead):-2] + (C, v.shape[-1]))
      return (kt[0], v[0]) if lead else (kt, v)

    def attend(q_R1NH, k_R1KH, v_R1KH):
      kt_RKH1 = k_R1KH.transpose(0, 2, 3, 1)
      v_RK1H = v_R1KH.transpose(0, 2, 1, 3)
      expand = (lambda x: x[None]) if lead else (lambda x: x)
      written = (jax.lax.dynamic_update_slice(k_cache, expand(kt_RKH1).astype(k_cache.dtype),
                                              lead + (0, 0, 0, t)),
                 jax.lax.dynamic_update_slice(v_cache, expand(v_RK1H).astype(v_cache.dtype),
                                              lead + (0, 0, t, 0)))
      out_R1NH = _group_attention(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, cache.prompt_mask_BP,
                                  lambda start: read(written, start), t, C, c)
      return out_R1NH, written

    return _block(layer, x_R1D, sin_BLH, cos_BLH, attend, c)

  if per_layer:
    ks, vs = [], []
    for i, layer in enumerate(params['layers']):
      x_R1D, (k_i, v_i) = layer_step(x_R1D, layer, cache.prompt_k[i], cache.prompt_v[i],
                                     cache.k[i], cache.v[i], None)
      ks.append(k_i)
      vs.append(v_i)
    k, v = tuple(ks), tuple(vs)
  else:
    def body(carry, xs):
      x_R1D, k_all, v_all = carry
      layer, prompt_k_BKPH, prompt_v_BKPH, i = xs
      x_R1D, (k_all, v_all) = layer_step(x_R1D, layer, prompt_k_BKPH, prompt_v_BKPH, k_all,
                                         v_all, i)
      return (x_R1D, k_all, v_all), None

    xs = (params['layers'], cache.prompt_k, cache.prompt_v, jnp.arange(c.n_layers))
    (x_R1D, k, v), _ = jax.lax.scan(body, (x_R1D, cache.k, cache.v), xs)
  logits_RV = _logits(params, c, _final_norm(params, x_R1D, c))[:, 0]
  return logits_RV, cache.replace(k=k, v=v, length=t + 1)


# ----------------------------------------------------------------------------------------
# Log-probabilities.


def token_logprobs(hidden_BTD, head_DV, targets_BT, *, vocab_chunk: int = 8192):
  """log p(target) and entropy of softmax(hidden @ head), without [B, T, V] logits.

  With z = hidden @ head (float32), lse = log sum_v exp z_v:
    logp_t = z_t[target_t] - lse_t,   entropy_t = lse_t - sum_v softmax(z_t)_v z_tv.
  The vocabulary is scanned in chunks of C columns with an online log-sum-exp (running max
  m, s = sum exp(z - m), w = sum exp(z - m) z); the chunk body is rematerialised so the
  backward pass also holds one [B, T, C] chunk at a time. Gradients are exact.

  Args:
    hidden_BTD: [B, T, D] hidden states (any float dtype; matmul accumulates in float32).
    head_DV: [D, V] output projection (`lm_head_DV(params, config)`).
    targets_BT: [B, T] int target ids.
    vocab_chunk: C, columns per chunk (V is padded up to a multiple of C internally).

  Returns:
    (logps_BT float32, entropy_BT float32).
  """
  chex.assert_rank([hidden_BTD, head_DV, targets_BT], [3, 2, 2])
  chex.assert_equal_shape_prefix([hidden_BTD, targets_BT], 2)
  if vocab_chunk <= 0:
    raise ValueError(f'vocab_chunk must be positive, got {vocab_chunk!r}')
  D, V = head_DV.shape
  C = min(vocab_chunk, V)
  n = -(-V // C)
  head_DV = head_DV.astype(hidden_BTD.dtype)
  head_nDC = jnp.pad(head_DV, ((0, 0), (0, n * C - V))).reshape(D, n, C).transpose(1, 0, 2)
  valid_nC = (jnp.arange(n * C) < V).reshape(n, C)

  @jax.checkpoint
  def chunk(carry, xs):
    m_BT, s_BT, w_BT = carry
    head_DC, valid_C = xs
    z_BTC = jnp.einsum('BTD,DC->BTC', hidden_BTD, head_DC, preferred_element_type=jnp.float32)
    z_BTC = jnp.where(valid_C, z_BTC, _MASKED)
    new_m_BT = jnp.maximum(m_BT, jnp.max(z_BTC, axis=-1))
    # The running max is only a numerical shift: lse = m + log s and w / s do not depend on
    # it, so treating it as a constant leaves every gradient exact.
    new_m_BT = jax.lax.stop_gradient(new_m_BT)
    decay_BT = jnp.exp(m_BT - new_m_BT)
    e_BTC = jnp.exp(z_BTC - new_m_BT[..., None])
    s_BT = s_BT * decay_BT + jnp.sum(e_BTC, axis=-1)
    w_BT = w_BT * decay_BT + jnp.sum(e_BTC * z_BTC, axis=-1)
    return (new_m_BT, s_BT, w_BT), None

  B, T = targets_BT.shape
  init = (jnp.full((B, T), _MASKED, jnp.float32), jnp.zeros((B, T), jnp.float32),
          jnp.zeros((B, T), jnp.float32))
  (m_BT, s_BT, w_BT), _ = jax.lax.scan(chunk, init, (head_nDC, valid_nC))
  lse_BT = m_BT + jnp.log(s_BT)
  target_DBT = jnp.take(head_DV, targets_BT, axis=1)
  target_logit_BT = jnp.einsum('BTD,DBT->BT', hidden_BTD, target_DBT,
                               preferred_element_type=jnp.float32)
  logps_BT = target_logit_BT - lse_BT
  entropy_BT = lse_BT - w_BT / s_BT
  return logps_BT, entropy_BT


def sequence_logprobs(params, config: ModelConfig, tokens_BL, input_mask_BL, *,
                      completion_start: int, vocab_chunk: int = 8192,
                      return_hidden: bool = False) -> dict:
  """Per-token log-probs and entropies of the completion region of [prompt | completion].

  tokens_BL = [left-padded prompt (static width P = completion_start) | completion (T)];
  positions = cumsum(input_mask) - 1 (clipped at 0); attention is causal over real keys.
  Completion token t (column P + t) is predicted by the hidden state at column P + t - 1.

  Returns:
    {'logps': [B, T] float32 log p(tokens[:, P+t] | prefix),
     'entropy': [B, T] float32 entropy of that next-token distribution,
     'hidden': [B, T, D] final-normed hidden state that predicted it (iff return_hidden)}.
    Values at pad positions are finite but meaningless; mask them.
  """
  chex.assert_rank([tokens_BL, input_mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, input_mask_BL])
  P = completion_start
  L = tokens_BL.shape[1]
  if not 1 <= P < L:
    raise ValueError(f'completion_start={P!r} must satisfy 1 <= completion_start < L={L}')
  hidden_BLD, _ = hidden_states(params, config, tokens_BL, positions_from_mask(input_mask_BL),
                                input_mask_BL)
  hidden_BTD = hidden_BLD[:, P - 1:L - 1]
  logps_BT, entropy_BT = token_logprobs(hidden_BTD, lm_head_DV(params, config),
                                        tokens_BL[:, P:], vocab_chunk=vocab_chunk)
  out = {'logps': logps_BT, 'entropy': entropy_BT}
  if return_hidden:
    out['hidden'] = hidden_BTD
  return out


# ----------------------------------------------------------------------------------------
# Logical axes of every parameter and cache field (`jtc.sharding` maps them to mesh axes).

_PARAM_AXES = {
    ('embed', 'embedding'): ('vocab', 'embed'),
    ('attn_norm', 'scale'): ('norm',),
    ('mlp_norm', 'scale'): ('norm',),
    ('final_norm', 'scale'): ('norm',),
    ('q', 'kernel'): ('embed', 'heads', 'head_dim'),
    ('q', 'bias'): ('heads', 'head_dim'),
    ('k', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('k', 'bias'): ('kv_heads', 'head_dim'),
    ('v', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('v', 'bias'): ('kv_heads', 'head_dim'),
    ('o', 'kernel'): ('heads', 'head_dim', 'embed'),
    ('q_norm', 'scale'): ('head_dim',),
    ('k_norm', 'scale'): ('head_dim',),
    ('gate', 'kernel'): ('embed', 'mlp'),
    ('up', 'kernel'): ('embed', 'mlp'),
    ('down', 'kernel'): ('mlp', 'embed'),
    ('lm_head', 'kernel'): ('embed', 'vocab'),
}

# Logical axes of the KV caches ([Y, B, K, S, H] and [B, S]) and of activations/batches.
CACHE_AXES = ('layers', 'batch', 'kv_heads', 'cache_length', 'head_dim')
CACHE_MASK_AXES = ('batch', 'cache_length')


def param_logical_axes(params) -> Any:
  """A pytree like `params` whose leaves are tuples of logical axis names; parameters under
  'layers' get the stacked 'layers' axis first."""
  def axes(path, leaf):
    key = tuple(p.key for p in path[-2:])
    if key not in _PARAM_AXES:
      raise ValueError(f'no logical axes for parameter {jax.tree_util.keystr(path)}; '
                       f'known: {sorted(_PARAM_AXES)}')
    names = _PARAM_AXES[key]
    if path[0].key == 'layers':
      names = ('layers',) + names
    if len(names) != leaf.ndim:
      raise ValueError(f'parameter {jax.tree_util.keystr(path)} has shape {leaf.shape}, '
                       f'expected rank {len(names)} for axes {names}')
    return names
  return jax.tree_util.tree_map_with_path(axes, params)
