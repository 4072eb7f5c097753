"""Decoder-only Transformer of the Llama / Qwen2 / Qwen3 / Qwen3.5 family: layers scanned over
stacked parameters, an explicit KV cache, chunked log-probabilities.

One set of pure functions covers the architectures:
  * RMSNorm (Llama/Qwen: ``x * rsqrt(mean(x^2) + eps) * scale``, computed in float32; Qwen3.5
    stores the weight zero-centred, ``* (1 + w)``);
  * rotary position embeddings in the Hugging Face "rotate_half" layout (first half / second
    half of the head dimension, not interleaved), so Hugging Face weights load unpermuted,
    with optional frequency scaling (``rope_scaling='linear'`` or Llama-3.1/3.2 ``'llama3'``),
    on the whole head or its first ``partial_rotary_factor`` part;
  * grouped-query attention (``n_kv_heads`` divides ``n_heads``), optionally with a sigmoid
    output gate per head dimension (Qwen3.5 ``attn_output_gate``);
  * optional RMSNorm over the head dimension of q and k before RoPE (Qwen3 ``qk_norm``);
  * optional q/k/v biases (Qwen2 ``attn_bias``); SwiGLU MLP; tied or untied output embeddings;
  * per-layer types (``layer_types``): Gated DeltaNet linear attention
    (`jtc.models.gated_deltanet`) in some layers, full attention in the others (Qwen3.5).

The parameters of the layers are stacked on a leading axis, one stack per sub-module kind
(`jtc.models.layer_types`), and the trunk is a `jax.lax.scan` (as maxtext's ``scan_layers``;
a hybrid scans over its repeating super-block): the compiled program, its compile time and
`init_params` (`jtc.models.params`) do not grow with depth. The parameter pytree (what
`init_params` returns, what `jtc.models.hf_import` fills) of a model whose Y layers are all
full attention + MLP is::

  {'embed': {'embedding': [V, D]},
   'layers': {'attn_norm': {'scale': [Y, D]},
              'attn': {'q': {'kernel': [Y, D, N, H], 'bias': [Y, N, H]},   # bias iff attn_bias
                       'k': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'v': {'kernel': [Y, D, K, H], 'bias': [Y, K, H]},
                       'o': {'kernel': [Y, N, H, D]},
                       'q_norm': {'scale': [Y, H]}, 'k_norm': {'scale': [Y, H]},  # iff qk_norm
                       'q_gate': {'kernel': [Y, D, N, H]}},            # iff attn_output_gate
              'mlp_norm': {'scale': [Y, D]},
              'mlp': {'gate': {'kernel': [Y, D, F]}, 'up': {'kernel': [Y, D, F]},
                      'down': {'kernel': [Y, F, D]}}},   # or a mixture of experts: `moe`
   'final_norm': {'scale': [D]},
   'lm_head': {'kernel': [D, V]}}                                    # absent iff tie_embeddings

In a hybrid, 'attn' holds the full-attention layers only and 'linear_attn' (layout in
`jtc.models.gated_deltanet`) the others; layer i is `layer_types.layer_params(params['layers'],
config, i)` (``jax.tree.map(lambda x: x[i], params['layers'])`` when all layers are of one
kind). The earlier per-layer layout (``'layers_0'``, ``'layers_1'``, ...) converts both ways with
`stack_layers` / `unstack_layers`.

The cache is a pytree passed in and returned: `KVCache` keys/values [Y, B, K, S, H] for S slots;
all sequences share one slot counter ``index`` (prompts are left-padded) and ``mask_BS`` records
which slots hold real tokens. Query slot ``index + l`` may see key slot ``s`` iff
``mask_BS[b, s]`` and ``s <= index + l``. The sampler's cache (the prompt once per group, the
live completion prefix in blocks, a hybrid's recurrent states) and its decode step are in
`jtc.models.decode`; the architecture and its presets in `jtc.models.model_config`.

Dimension key (docs/dimensions.md):
  B batch (prompts), G samples per prompt, R = B * G rows, L tokens in this call, S cache slots,
  P prompt length, T completion length, Y layers, N query heads, K kv heads,
  Q query heads per kv head (N = K * Q), H head dim, D model dim, F mlp dim, V vocab,
  C vocab chunk / cache block, n number of chunks.
"""

import contextlib
import functools
import math
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import attention
from jtc.models import gated_deltanet
from jtc.models import layer_types
from jtc.models import layers
from jtc.models import moe
from jtc.models.axes import CACHE_AXES, CACHE_MASK_AXES, param_logical_axes  # the model's
from jtc.models.model_config import ModelConfig  # the architecture this module implements
# The parameters' initialisation and layout conversion (re-exported).
from jtc.models.params import (_init_params_jit, init_params, num_params, stack_layers,
                               unstack_layers)

# ----------------------------------------------------------------------------------------
# Caches.


@flax.struct.dataclass
class KVCache:
  """Keys/values (RoPE already applied) of every full-attention layer for S slots, and the
  recurrent states of a hybrid's linear-attention layers.

  Attributes:
    k: [Y, B, K, S, H] in the compute dtype (Y: the full-attention layers).
    v: [Y, B, K, S, H].
    mask_BS: [B, S] bool, True where a slot holds a real (non-pad) token.
    index: [] int32, the next slot to write (shared by the whole batch).
    linear: None, or a `gated_deltanet.LinearState` stacked over the linear-attention layers.
  """
  k: jax.Array
  v: jax.Array
  mask_BS: jax.Array
  index: jax.Array
  linear: Any = None


def init_cache(config: ModelConfig, batch_size: int, cache_len: int) -> KVCache:
  """An empty cache of `cache_len` slots (and zero recurrent states)."""
  sizes = layer_types.stack_sizes(config)
  shape = (sizes.get('attn', 0), batch_size, config.n_kv_heads, cache_len, config.head_dim)
  linear = None
  if 'linear_attn' in sizes:
    one = gated_deltanet.init_state(config, batch_size)
    linear = jax.tree.map(lambda x: jnp.zeros((sizes['linear_attn'], *x.shape), x.dtype), one)
  return KVCache(k=jnp.zeros(shape, config.jnp_dtype), v=jnp.zeros(shape, config.jnp_dtype),
                 mask_BS=jnp.zeros((batch_size, cache_len), bool), index=jnp.zeros(
                     (), jnp.int32), linear=linear)


# ----------------------------------------------------------------------------------------
# Layer pieces (pure functions of one layer's parameters).


def embed_tokens(params, tokens_BL, config: ModelConfig):
  return jnp.take(params['embed']['embedding'], tokens_BL, axis=0).astype(config.jnp_dtype)


def final_norm(params, x_BLD, config: ModelConfig):
  return layers.norm(x_BLD, params['final_norm'], config)


def _to_BKLH(x_BLKH):
  return x_BLKH.transpose(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------
# The trunk: a scan over the stacked layers (`layer_types.scan_layers`).


def trunk(params, config: ModelConfig, x_BLD, sin_BLH, cos_BLH, mask_BL, *, return_kv: bool = False,
          replay_YBLW=None):
  """Causal attention over the L tokens themselves (real keys only), by `config.attention`;
  the chunked Gated DeltaNet from a zero state in a hybrid's linear-attention layers.

  Returns (x_BLD, states, routed): states {} or, when `return_kv` (a prompt cache), {'attn':
  (k, v)} with the keys/values of the full-attention layers, each [Y, B, K, L, H], and in a
  hybrid 'linear_attn': the linear layers' `gated_deltanet.LinearState` after the L tokens,
  stacked; routed the layers' `moe.Routed` (leaves [Y, ...]) of a mixture-of-experts model, else
  None. ``replay_YBLW``: experts to route each layer's tokens to (`moe.route`), or None."""
  c = config

  def attend(q_BLNH, k_BLKH, v_BLKH):
    out_BLNH = attention.causal_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, c)
    return out_BLNH, ((_to_BKLH(k_BLKH), _to_BKLH(v_BLKH)) if return_kv else None)

  def layer_fn(kind, x_BLD, layer, _):
    p, replay = layer
    if kind.mixer == 'linear_attention':

      def mixer(h_BLD):
        out_BLD, state = gated_deltanet.mix(p['linear_attn'], h_BLD, mask_BL, c)
        return out_BLD, (state if return_kv else None)
    else:
      mixer = layers.attention_mixer(p['attn'], sin_BLH, cos_BLH, attend, c)
    return layers.block(p, x_BLD, mixer, c, kind, mask_BL=mask_BL,
                        replay_BLW=replay.get(kind.ffn_stack))

  replay = {} if replay_YBLW is None else {'mlp': replay_YBLW}
  x_BLD, out = layer_types.scan_layers(layer_fn, x_BLD, (params['layers'], replay), c,
                                       remat=c.remat)
  routed = out.pop('mlp', None)
  return x_BLD, out, routed


def _trunk_with_cache(params, config: ModelConfig, x_BLD, sin_BLH, cos_BLH, mask_BL,
                      cache: KVCache):
  """Writes the L new tokens at slots index .. index + L - 1 and attends over the cache; a
  hybrid's linear layers continue from their cached states."""
  c = config
  L = x_BLD.shape[1]
  index = cache.index
  key_mask_BS = jax.lax.dynamic_update_slice(cache.mask_BS, mask_BL.astype(bool), (0, index))
  S = key_mask_BS.shape[1]
  causal_LS = jnp.arange(S)[None, :] <= (index + jnp.arange(L))[:, None]
  allowed_BLS = key_mask_BS[:, None, :] & causal_LS[None]

  def layer_fn(kind, x_BLD, layer, _):
    p, states = layer
    if kind.mixer == 'linear_attention':

      def mixer(h_BLD):
        return gated_deltanet.mix(p['linear_attn'], h_BLD, mask_BL, c, states['linear_attn'])
    else:
      k_BKSH, v_BKSH = states['attn']

      def attend(q_BLNH, k_BLKH, v_BLKH):
        k_new = jax.lax.dynamic_update_slice(k_BKSH,
                                             _to_BKLH(k_BLKH).astype(k_BKSH.dtype),
                                             (0, 0, index, 0))
        v_new = jax.lax.dynamic_update_slice(v_BKSH,
                                             _to_BKLH(v_BLKH).astype(v_BKSH.dtype),
                                             (0, 0, index, 0))
        return layers.softmax_attention(q_BLNH, k_new, v_new, allowed_BLS, c), (k_new, v_new)

      mixer = layers.attention_mixer(p['attn'], sin_BLH, cos_BLH, attend, c)
    return layers.block(p, x_BLD, mixer, c, kind, mask_BL=mask_BL)

  states = {'attn': (cache.k, cache.v)}
  if cache.linear is not None:
    states['linear_attn'] = cache.linear
  x_BLD, out = layer_types.scan_layers(layer_fn, x_BLD, (params['layers'], states), c)
  k, v = out.get('attn', (cache.k, cache.v))
  return x_BLD, KVCache(k=k, v=v, mask_BS=key_mask_BS, index=index + L,
                        linear=out.get('linear_attn')), out.get('mlp')


def constrain_rows(x, row_sharding):
  """``x`` (an array or pytree of [B, ...] rows) constrained to ``row_sharding(x)``: a hashable
  function from values to their shardings (`jtc.rl.sharding.RowSharding`), or None (no
  constraint: XLA's propagation decides)."""
  return x if row_sharding is None else jax.lax.with_sharding_constraint(x, row_sharding(x))


def rows_mesh(row_sharding):
  """The rows' mesh as the abstract mesh in context while tracing the trunk (a mixture of
  experts sorts each shard's rows by it, `moe.rows_local`), unless one is set already or there
  is no ``row_sharding``."""
  if row_sharding is None or not jax.sharding.get_abstract_mesh().empty:
    return contextlib.nullcontext()
  return jax.sharding.use_abstract_mesh(row_sharding.mesh.abstract_mesh)


def hidden_states(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
                  cache: KVCache | None = None, *, row_sharding=None, replay_YBLW=None):
  """The trunk only: (final-normed hidden [B, L, D], cache or None, `moe.Routed` of the layers or
  None). No LM head. ``row_sharding``: the embedded tokens' rows constrained to it
  (`constrain_rows`); ``replay_YBLW``: as `trunk` (without a cache)."""
  chex.assert_rank([tokens_BL, positions_BL, mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, positions_BL, mask_BL])
  sin_BLH, cos_BLH = layers.rope_sin_cos(positions_BL, config)
  x_BLD = constrain_rows(embed_tokens(params, tokens_BL, config), row_sharding)
  with rows_mesh(row_sharding):
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
