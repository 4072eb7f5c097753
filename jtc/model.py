"""Decoder-only Transformer of the Llama / Qwen2 / Qwen3 family, with an explicit KV cache.

One module family covers the three architectures:
  * RMSNorm (Llama/Qwen: ``x * rsqrt(mean(x^2) + eps) * scale``, computed in float32);
  * rotary position embeddings in the Hugging Face "rotate_half" layout (first half / second
    half of the head dimension, not interleaved), so Hugging Face weights load unpermuted;
  * grouped-query attention (``n_kv_heads`` divides ``n_heads``);
  * optional RMSNorm over the head dimension of q and k before RoPE (Qwen3 ``qk_norm``);
  * optional q/k/v biases (Qwen2 ``attn_bias``);
  * SwiGLU MLP ``down(silu(gate(x)) * up(x))``;
  * tied or untied output embeddings.

The parameter pytree (what `init_params` returns, what `jtc.hf_import` fills) is::

  {'embed': {'embedding': [V, D]},
   'layers_i': {'attn_norm': {'scale': [D]},
                'attn': {'q': {'kernel': [D, N, H], 'bias': [N, H]},   # bias iff attn_bias
                         'k': {'kernel': [D, K, H], 'bias': [K, H]},
                         'v': {'kernel': [D, K, H], 'bias': [K, H]},
                         'o': {'kernel': [N, H, D]},
                         'q_norm': {'scale': [H]}, 'k_norm': {'scale': [H]}},  # iff qk_norm
                'mlp_norm': {'scale': [D]},
                'mlp': {'gate': {'kernel': [D, F]}, 'up': {'kernel': [D, F]},
                        'down': {'kernel': [F, D]}}},
   'final_norm': {'scale': [D]},
   'lm_head': {'kernel': [D, V]}}                                    # absent iff tie_embeddings

The KV cache (`KVCache`) is a pytree passed in and returned; all sequences of a batch share
one slot counter ``index`` (prompts are left-padded), and ``mask_BS`` records which slots
hold real tokens. Attention from query slot ``index + l`` may see key slot ``s`` iff
``mask_BS[b, s]`` and ``s <= index + l``.

Dimension key:
  B batch, L tokens in this call, S cache slots, P prompt length, T completion length,
  N query heads, K kv heads, R query heads per kv head (N = K * R), H head dim,
  D model dim, F mlp dim, V vocab, C vocab chunk, n number of vocab chunks.
"""

import dataclasses
import functools
import math
from typing import Any

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
_MASKED = -1e30  # finite "minus infinity": a fully masked row softmaxes to uniform, not NaN.


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
  norm_eps: float = 1e-6
  qk_norm: bool = False
  attn_bias: bool = False
  tie_embeddings: bool = True
  param_dtype: str = 'float32'
  dtype: str = 'float32'
  max_seq_len: int = 2048
  # Rematerialise each block's activations in the backward pass (jax.checkpoint via
  # nn.remat): memory O(n_layers * B L D) instead of O(n_layers * B L (D + F + N S)),
  # for about one extra forward pass. Same parameters, same values, same gradients.
  remat: bool = False

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'n_layers', 'n_heads', 'n_kv_heads', 'head_dim',
                 'd_ff', 'max_seq_len'):
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
    """Llama-3.2-1B sizes. NOTE: its "llama3" RoPE frequency scaling is not modelled."""
    return cls(**{**dict(vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32,
                         n_kv_heads=8, head_dim=64, d_ff=8192, rope_theta=500_000.0,
                         norm_eps=1e-5, qk_norm=False, attn_bias=False, tie_embeddings=True,
                         param_dtype='bfloat16', dtype='bfloat16', max_seq_len=131_072),
                  **overrides})


def num_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


# ----------------------------------------------------------------------------------------
# KV cache.


@flax.struct.dataclass
class KVCache:
  """Per-layer keys/values (RoPE already applied) for S slots.

  Attributes:
    k: tuple of n_layers arrays [B, S, K, H] in the compute dtype.
    v: tuple of n_layers arrays [B, S, K, H].
    mask_BS: [B, S] bool, True where a slot holds a real (non-pad) token.
    index: [] int32, the next slot to write (shared by the whole batch).
  """
  k: tuple
  v: tuple
  mask_BS: jax.Array
  index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, cache_len: int) -> KVCache:
  """An empty cache of `cache_len` slots."""
  shape = (batch_size, cache_len, config.n_kv_heads, config.head_dim)
  zeros = lambda: jnp.zeros(shape, config.jnp_dtype)
  return KVCache(k=tuple(zeros() for _ in range(config.n_layers)),
                 v=tuple(zeros() for _ in range(config.n_layers)),
                 mask_BS=jnp.zeros((batch_size, cache_len), bool),
                 index=jnp.zeros((), jnp.int32))


def repeat_cache(cache: KVCache, repeats: int) -> KVCache:
  """Row b -> rows b*repeats ... b*repeats + repeats - 1 (groups contiguous)."""
  rep = lambda x: jnp.repeat(x, repeats, axis=0)
  return KVCache(k=tuple(map(rep, cache.k)), v=tuple(map(rep, cache.v)),
                 mask_BS=rep(cache.mask_BS), index=cache.index)


# ----------------------------------------------------------------------------------------
# Modules.


def _normal_init(fan_in: int):
  return nn.initializers.normal(stddev=1.0 / math.sqrt(fan_in))


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2) + eps) * scale, in float32, cast back to `dtype`."""
  eps: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


class Einsum(nn.Module):
  """y = einsum(eqn, x, kernel) (+ bias); kernel ~ N(0, 1/fan_in)."""
  eqn: str
  kernel_shape: tuple
  fan_in: int
  dtype: Any
  param_dtype: Any
  bias_shape: tuple | None = None

  @nn.compact
  def __call__(self, x):
    kernel = self.param('kernel', _normal_init(self.fan_in), self.kernel_shape, self.param_dtype)
    y = jnp.einsum(self.eqn, x.astype(self.dtype), kernel.astype(self.dtype))
    if self.bias_shape is not None:
      bias = self.param('bias', nn.initializers.zeros, self.bias_shape, self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


def rope_sin_cos(positions_BL, head_dim: int, theta: float):
  """sin/cos [B, L, H] for the rotate_half layout: angle_j = pos * theta^(-2j/H), j < H/2."""
  inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  angles = positions_BL.astype(jnp.float32)[..., None] * inv_freq  # [B, L, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BLNH, sin_BLH, cos_BLH):
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of H), in float32."""
  x = x_BLNH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]
  return out.astype(x_BLNH.dtype)


class Attention(nn.Module):
  """Grouped-query causal self-attention over the new tokens plus the cache slots."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS):
    c = self.config
    D, N, K, H = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    dense = functools.partial(Einsum, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    q_BLNH = dense('BLD,DNH->BLNH', (D, N, H), D, bias_shape=(N, H) if c.attn_bias else None,
                   name='q')(x_BLD)
    k_BLKH = dense('BLD,DKH->BLKH', (D, K, H), D, bias_shape=(K, H) if c.attn_bias else None,
                   name='k')(x_BLD)
    v_BLKH = dense('BLD,DKH->BLKH', (D, K, H), D, bias_shape=(K, H) if c.attn_bias else None,
                   name='v')(x_BLD)
    if c.qk_norm:
      norm = functools.partial(RMSNorm, eps=c.norm_eps, dtype=c.jnp_dtype,
                               param_dtype=c.jnp_param_dtype)
      q_BLNH = norm(name='q_norm')(q_BLNH)
      k_BLKH = norm(name='k_norm')(k_BLKH)
    q_BLNH = apply_rope(q_BLNH, sin_BLH, cos_BLH)
    k_BLKH = apply_rope(k_BLKH, sin_BLH, cos_BLH)

    if kv is None:  # no cache: the keys are exactly the new tokens, slots 0..L-1.
      k_BSKH, v_BSKH = k_BLKH, v_BLKH
    else:
      k_BSKH = jax.lax.dynamic_update_slice(kv[0], k_BLKH.astype(kv[0].dtype), (0, index, 0, 0))
      v_BSKH = jax.lax.dynamic_update_slice(kv[1], v_BLKH.astype(kv[1].dtype), (0, index, 0, 0))

    B, L = x_BLD.shape[:2]
    S = k_BSKH.shape[1]
    q_BLKRH = q_BLNH.reshape(B, L, K, N // K, H)
    scores_BKRLS = jnp.einsum('BLKRH,BSKH->BKRLS', q_BLKRH, k_BSKH.astype(c.jnp_dtype),
                              preferred_element_type=jnp.float32) / math.sqrt(H)
    query_slot_L = index + jnp.arange(L)
    causal_LS = jnp.arange(S)[None, :] <= query_slot_L[:, None]
    allowed_BLS = key_mask_BS[:, None, :] & causal_LS[None]
    scores_BKRLS = jnp.where(allowed_BLS[:, None, None], scores_BKRLS, _MASKED)
    probs_BKRLS = jax.nn.softmax(scores_BKRLS, axis=-1).astype(c.jnp_dtype)
    out_BLKRH = jnp.einsum('BKRLS,BSKH->BLKRH', probs_BKRLS, v_BSKH.astype(c.jnp_dtype))
    out_BLNH = out_BLKRH.reshape(B, L, N, H)
    y_BLD = dense('BLNH,NHD->BLD', (N, H, D), N * H, name='o')(out_BLNH)
    return y_BLD, (k_BSKH, v_BSKH)


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dense = functools.partial(Einsum, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    gate_BLF = dense('BLD,DF->BLF', (c.d_model, c.d_ff), c.d_model, name='gate')(x_BLD)
    up_BLF = dense('BLD,DF->BLF', (c.d_model, c.d_ff), c.d_model, name='up')(x_BLD)
    return dense('BLF,FD->BLD', (c.d_ff, c.d_model), c.d_ff, name='down')(
        jax.nn.silu(gate_BLF) * up_BLF)


class Block(nn.Module):
  """Pre-norm residual block: x += attn(norm(x)); x += mlp(norm(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS):
    c = self.config
    norm = functools.partial(RMSNorm, eps=c.norm_eps, dtype=c.jnp_dtype,
                             param_dtype=c.jnp_param_dtype)
    h_BLD, kv = Attention(c, name='attn')(norm(name='attn_norm')(x_BLD), sin_BLH, cos_BLH, kv,
                                          index, key_mask_BS)
    x_BLD = x_BLD + h_BLD
    x_BLD = x_BLD + MLP(c, name='mlp')(norm(name='mlp_norm')(x_BLD))
    return x_BLD, kv


class Embedder(nn.Module):
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embedding = self.param('embedding', _normal_init(c.d_model),
                                (c.vocab_size, c.d_model), c.jnp_param_dtype)

  def __call__(self, tokens_BL):
    return jnp.take(self.embedding, tokens_BL, axis=0).astype(self.config.jnp_dtype)


class Transformer(nn.Module):
  """`__call__(tokens, positions, mask, cache) -> (final-normed hidden [B, L, D], cache)`."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embed = Embedder(c)
    block = nn.remat(Block) if c.remat else Block
    self.layers = [block(c) for _ in range(c.n_layers)]  # named layers_0, layers_1, ...
    self.final_norm = RMSNorm(eps=c.norm_eps, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    if not c.tie_embeddings:
      self.lm_head = Einsum('BLD,DV->BLV', (c.d_model, c.vocab_size), c.d_model,
                            dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)

  def __call__(self, tokens_BL, positions_BL, mask_BL, cache: KVCache | None = None):
    c = self.config
    L = tokens_BL.shape[1]
    if cache is None:
      index = 0
      key_mask_BS = mask_BL.astype(bool)
      kvs = [None] * c.n_layers
    else:
      index = cache.index
      key_mask_BS = jax.lax.dynamic_update_slice(cache.mask_BS, mask_BL.astype(bool), (0, index))
      kvs = list(zip(cache.k, cache.v))
    sin_BLH, cos_BLH = rope_sin_cos(positions_BL, c.head_dim, c.rope_theta)
    x_BLD = self.embed(tokens_BL)
    new_kvs = []
    for layer, kv in zip(self.layers, kvs):
      x_BLD, kv = layer(x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS)
      new_kvs.append(kv)
    hidden_BLD = self.final_norm(x_BLD)
    if cache is not None:
      cache = KVCache(k=tuple(kv[0] for kv in new_kvs), v=tuple(kv[1] for kv in new_kvs),
                      mask_BS=key_mask_BS, index=cache.index + L)
    return hidden_BLD, cache

  def logits(self, hidden_BLD):
    if self.config.tie_embeddings:
      head_DV = self.embed.embedding.T
    else:
      head_DV = self.lm_head.variables['params']['kernel']
    return jnp.einsum('BLD,DV->BLV', hidden_BLD, head_DV.astype(hidden_BLD.dtype),
                      preferred_element_type=jnp.float32)

  def init_all(self, tokens_BL, positions_BL, mask_BL):
    hidden_BLD, _ = self(tokens_BL, positions_BL, mask_BL)
    if not self.config.tie_embeddings:
      self.lm_head(hidden_BLD)  # creates lm_head/kernel
    return self.logits(hidden_BLD)


# ----------------------------------------------------------------------------------------
# Pure functions (config is static under jit).


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(config: ModelConfig, rng: jax.Array) -> dict:
  tokens = jnp.zeros((1, 2), jnp.int32)
  variables = Transformer(config).init(rng, tokens, tokens, jnp.ones_like(tokens),
                                       method=Transformer.init_all)
  return flax.core.unfreeze(variables['params'])


def init_params(config: ModelConfig, rng: jax.Array) -> dict:
  """Random parameters in the layout documented at the top of this module.

  Kernels ~ N(0, 1/fan_in), embedding ~ N(0, 1/D), norm scales 1, biases 0.
  """
  return _init_params_jit(config, rng)


def positions_from_mask(mask_BL):
  """Position of each token among the real ones: cumsum(mask) - 1, clipped at 0 (pads)."""
  return jnp.maximum(jnp.cumsum(mask_BL.astype(jnp.int32), axis=-1) - 1, 0)


def lm_head_DV(params, config: ModelConfig):
  """The output projection [D, V]: embedding^T when tied, else lm_head/kernel."""
  if config.tie_embeddings:
    return params['embed']['embedding'].T
  return params['lm_head']['kernel']


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
  chex.assert_rank([tokens_BL, positions_BL, mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, positions_BL, mask_BL])
  module = Transformer(config)
  hidden_BLD, cache = module.apply({'params': params}, tokens_BL, positions_BL, mask_BL, cache)
  logits_BLV = module.apply({'params': params}, hidden_BLD, method=Transformer.logits)
  return ForwardOutput(logits_BLV=logits_BLV, hidden_BLD=hidden_BLD if return_hidden else None,
                       cache=cache)


def hidden_states(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
                  cache: KVCache | None = None):
  """The trunk only: (final-normed hidden [B, L, D], cache). No LM head."""
  return Transformer(config).apply({'params': params}, tokens_BL, positions_BL, mask_BL, cache)


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
# Logical axes of every parameter (`jtc.sharding` maps them to mesh axes).

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

# Logical axes of the KV cache fields and of activations/batches.
CACHE_AXES = ('batch', 'cache_length', 'kv_heads', 'head_dim')
CACHE_MASK_AXES = ('batch', 'cache_length')


def param_logical_axes(params) -> Any:
  """A pytree like `params` whose leaves are tuples of logical axis names."""
  def axes(path, leaf):
    key = tuple(p.key for p in path[-2:])
    if key not in _PARAM_AXES:
      raise ValueError(f'no logical axes for parameter {jax.tree_util.keystr(path)}; '
                       f'known: {sorted(_PARAM_AXES)}')
    names = _PARAM_AXES[key]
    if len(names) != leaf.ndim:
      raise ValueError(f'parameter {jax.tree_util.keystr(path)} has shape {leaf.shape}, '
                       f'expected rank {len(names)} for axes {names}')
    return names
  return jax.tree_util.tree_map_with_path(axes, params)
