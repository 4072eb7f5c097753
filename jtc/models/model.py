"""Decoder-only Transformer of the Llama / Qwen2 / Qwen3 family: layers scanned over stacked
parameters, an explicit KV cache, chunked log-probabilities.

One set of pure functions covers the three architectures:
  * RMSNorm (Llama/Qwen: ``x * rsqrt(mean(x^2) + eps) * scale``, computed in float32);
  * rotary position embeddings in the Hugging Face "rotate_half" layout (first half / second
    half of the head dimension, not interleaved), so Hugging Face weights load unpermuted,
    with optional frequency scaling (``rope_scaling='linear'`` or Llama-3.1/3.2 ``'llama3'``);
  * grouped-query attention (``n_kv_heads`` divides ``n_heads``);
  * optional RMSNorm over the head dimension of q and k before RoPE (Qwen3 ``qk_norm``);
  * optional q/k/v biases (Qwen2 ``attn_bias``); SwiGLU MLP; tied or untied output embeddings.

The layers share one structure, so their parameters are stacked on a leading axis of size
Y = n_layers and the trunk is one `jax.lax.scan` over them (as maxtext's ``scan_layers``): the
compiled program, its compile time and `init_params` do not grow with depth. The parameter
pytree (what `init_params` returns, what `jtc.models.hf_import` fills) is::

  {'embed': {'embedding': [V, D]},
   'layers': {'attn_norm': {'scale': [Y, D]},
              'attn': {'q': {'kernel': [Y, D, N, H], 'bias': [Y, N, H]},   # bias iff attn_bias
                       'k': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'v': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'o': {'kernel': [Y, N, H, D]},
                       'q_norm': {'scale': [Y, H]}, 'k_norm': {'scale': [Y, H]}},  # iff qk_norm
              'mlp_norm': {'scale': [Y, D]},
              'mlp': {'gate': {'kernel': [Y, D, F]}, 'up': {'kernel': [Y, D, F]},
                      'down': {'kernel': [Y, F, D]}}},   # or a mixture of experts: `moe`
   'final_norm': {'scale': [D]},
   'lm_head': {'kernel': [D, V]}}                                    # absent iff tie_embeddings

Layer i is ``jax.tree.map(lambda x: x[i], params['layers'])``. The earlier per-layer layout
(``'layers_0'``, ``'layers_1'``, ...) converts both ways with `stack_layers` / `unstack_layers`.

The cache is a pytree passed in and returned: `KVCache` keys/values [Y, B, K, S, H] for S slots;
all sequences share one slot counter ``index`` (prompts are left-padded) and ``mask_BS`` records
which slots hold real tokens. Query slot ``index + l`` may see key slot ``s`` iff
``mask_BS[b, s]`` and ``s <= index + l``. The sampler's cache (the prompt once per group, the
live completion prefix in blocks) and its decode step are in `jtc.models.decode`; the architecture and
its presets in `jtc.models.model_config`.

Dimension key (docs/dimensions.md):
  B batch (prompts), G samples per prompt, R = B * G rows, L tokens in this call, S cache slots,
  P prompt length, T completion length, Y layers, N query heads, K kv heads,
  Q query heads per kv head (N = K * Q), H head dim, D model dim, F mlp dim, V vocab,
  C vocab chunk / cache block, n number of chunks.
"""

import functools
import math

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import attention
from jtc.models import layers
from jtc.models.axes import CACHE_AXES, CACHE_MASK_AXES, param_logical_axes  # the model's
from jtc.models import moe
from jtc.models.model_config import ModelConfig  # the architecture this module implements


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
  attn = {
      'q': {
          'kernel': _normal(kq, (D, N, H), D, dt)
      },
      'k': {
          'kernel': _normal(kk, (D, K, H), D, dt)
      },
      'v': {
          'kernel': _normal(kv, (D, K, H), D, dt)
      },
      'o': {
          'kernel': _normal(ko, (N, H, D), N * H, dt)
      }
  }
  if c.attn_bias:
    for name, heads in (('q', N), ('k', K), ('v', K)):
      attn[name]['bias'] = jnp.zeros((heads, H), dt)
  if c.qk_norm:
    attn['q_norm'] = {'scale': jnp.ones((H,), dt)}
    attn['k_norm'] = {'scale': jnp.ones((H,), dt)}
  if c.is_moe:
    mlp = moe.init_ffn(c, kg)
  else:
    mlp = {
        'gate': {
            'kernel': _normal(kg, (D, F), D, dt)
        },
        'up': {
            'kernel': _normal(ku, (D, F), D, dt)
        },
        'down': {
            'kernel': _normal(kd, (F, D), F, dt)
        }
    }
  return {
      'attn_norm': {
          'scale': jnp.ones((D,), dt)
      },
      'attn': attn,
      'mlp_norm': {
          'scale': jnp.ones((D,), dt)
      },
      'mlp': mlp
  }


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(config: ModelConfig, rng: jax.Array) -> dict:
  c = config
  k_embed, k_layers, k_head = jax.random.split(rng, 3)
  params = {
      'embed': {
          'embedding': _normal(k_embed, (c.vocab_size, c.d_model), c.d_model, c.jnp_param_dtype)
      },
      'layers': jax.vmap(functools.partial(_init_layer, c))(jax.random.split(k_layers, c.n_layers)),
      'final_norm': {
          'scale': jnp.ones((c.d_model,), c.jnp_param_dtype)
      }
  }
  if not c.tie_embeddings:
    params['lm_head'] = {
        'kernel': _normal(k_head, (c.d_model, c.vocab_size), c.d_model, c.jnp_param_dtype)
    }
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
                 mask_BS=jnp.zeros((batch_size, cache_len), bool), index=jnp.zeros((), jnp.int32))


# ----------------------------------------------------------------------------------------
# Layer pieces (pure functions of one layer's parameters).


def embed_tokens(params, tokens_BL, config: ModelConfig):
  return jnp.take(params['embed']['embedding'], tokens_BL, axis=0).astype(config.jnp_dtype)


def final_norm(params, x_BLD, config: ModelConfig):
  return layers.rms_norm(x_BLD, params['final_norm']['scale'], config.norm_eps, config.jnp_dtype)


def _to_BKLH(x_BLKH):
  return x_BLKH.transpose(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------
# The trunk: one scan over the stacked layers.


def trunk(params, config: ModelConfig, x_BLD, sin_BLH, cos_BLH, mask_BL, *, return_kv: bool = False,
          replay_YBLW=None):
  """Causal attention over the L tokens themselves (real keys only), by `config.attention`.

  Returns (x_BLD, kv, routed): kv is None or the keys/values of every layer, each
  [Y, B, K, L, H] (a prompt cache, when `return_kv`); routed the layers' `moe.Routed` (leaves
  [Y, ...]) of a mixture-of-experts model, else None. ``replay_YBLW``: experts to route each
  layer's tokens to (`moe.route`), or None."""
  c = config

  def attend(q_BLNH, k_BLKH, v_BLKH):
    out_BLNH = attention.causal_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, c)
    return out_BLNH, ((_to_BKLH(k_BLKH), _to_BKLH(v_BLKH)) if return_kv else None)

  def body(x_BLD, xs):
    layer, replay_BLW = xs
    x_BLD, kv, routed = layers.block(layer, x_BLD, sin_BLH, cos_BLH, attend, c, mask_BL=mask_BL,
                                     replay_BLW=replay_BLW)
    return x_BLD, (kv, routed)

  if c.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  x_BLD, (kv, routed) = jax.lax.scan(body, x_BLD, (params['layers'], replay_YBLW))
  return x_BLD, kv, routed


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
      k_new = jax.lax.dynamic_update_slice(k_BKSH,
                                           _to_BKLH(k_BLKH).astype(k_BKSH.dtype), (0, 0, index, 0))
      v_new = jax.lax.dynamic_update_slice(v_BKSH,
                                           _to_BKLH(v_BLKH).astype(v_BKSH.dtype), (0, 0, index, 0))
      return layers.softmax_attention(q_BLNH, k_new, v_new, allowed_BLS, c), (k_new, v_new)

    x_BLD, kv, routed = layers.block(layer, x_BLD, sin_BLH, cos_BLH, attend, c, mask_BL=mask_BL)
    return x_BLD, (kv, routed)

  x_BLD, ((k, v), routed) = jax.lax.scan(body, x_BLD, (params['layers'], cache.k, cache.v))
  return x_BLD, KVCache(k=k, v=v, mask_BS=key_mask_BS, index=index + L), routed


def constrain_rows(x, row_sharding):
  """``x`` (an array or pytree of [B, ...] rows) constrained to ``row_sharding(x)``: a hashable
  function from values to their shardings (`jtc.rl.sharding.RowSharding`), or None (no
  constraint: XLA's propagation decides)."""
  return x if row_sharding is None else jax.lax.with_sharding_constraint(x, row_sharding(x))


def hidden_states(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
                  cache: KVCache | None = None, *, row_sharding=None, replay_YBLW=None):
  """The trunk only: (final-normed hidden [B, L, D], cache or None, `moe.Routed` of the layers or
  None). No LM head. ``row_sharding``: the embedded tokens' rows constrained to it
  (`constrain_rows`); ``replay_YBLW``: as `trunk` (without a cache)."""
  chex.assert_rank([tokens_BL, positions_BL, mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, positions_BL, mask_BL])
  sin_BLH, cos_BLH = layers.rope_sin_cos(positions_BL, config)
  x_BLD = constrain_rows(embed_tokens(params, tokens_BL, config), row_sharding)
  if cache is None:
    x_BLD, _, routed = trunk(params, config, x_BLD, sin_BLH, cos_BLH, mask_BL,
                             replay_YBLW=replay_YBLW)
  else:
    x_BLD, cache, routed = _trunk_with_cache(params, config, x_BLD, sin_BLH, cos_BLH, mask_BL,
                                             cache)
  return final_norm(params, x_BLD, config), cache, routed


def positions_from_mask(mask_BL):
  """Position of each token among the real ones: cumsum(mask) - 1, clipped at 0 (pads)."""
  return jnp.maximum(jnp.cumsum(mask_BL.astype(jnp.int32), axis=-1) - 1, 0)


def lm_head_DV(params, config: ModelConfig):
  """The output projection [D, V]: embedding^T when tied, else lm_head/kernel."""
  if config.tie_embeddings:
    return params['embed']['embedding'].T
  return params['lm_head']['kernel']


def logits(params, config: ModelConfig, hidden_BLD):
  """float32 logits [B, L, V] of final-normed hidden states."""
  head_DV = lm_head_DV(params, config)
  return jnp.einsum('BLD,DV->BLV', hidden_BLD, head_DV.astype(hidden_BLD.dtype),
                    preferred_element_type=jnp.float32)


@flax.struct.dataclass
class ForwardOutput:
  """logits_BLV float32 [B, L, V]; hidden_BLD [B, L, D] final-normed (None unless asked);
  cache the updated `KVCache` (None if none was passed); routed the layers' `moe.Routed` of a
  mixture-of-experts model (None for a dense one)."""
  logits_BLV: jax.Array
  hidden_BLD: jax.Array | None
  cache: KVCache | None
  routed: moe.Routed | None = None


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
  hidden_BLD, cache, routed = hidden_states(params, config, tokens_BL, positions_BL, mask_BL, cache)
  return ForwardOutput(logits_BLV=logits(params, config, hidden_BLD),
                       hidden_BLD=hidden_BLD if return_hidden else None, cache=cache, routed=routed)
