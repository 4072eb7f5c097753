"""Decoding for the sampler: prefill each prompt once, then decode steps against a `GroupCache`.

`GroupCache` holds the prompt's keys/values ONCE per prompt [Y, B, K, P, H], shared by its G
samples, plus each sample's own completion keys/values [Y, B*G, K, ...]. `decode_step` attends
from the G rows of a group to the shared prompt block (one read per prompt) and to the live
prefix of their own completion cache, in fixed-size blocks up to the current length (a
`jax.lax.fori_loop`), combining the parts with an online softmax; the layers run as the model's
scan or, with `split_layers` / `split_cache`, as an unrolled loop (faster on XLA:CPU).

In a hybrid (`jtc.models.layer_types`) Y counts the full-attention layers only; each
linear-attention layer keeps, per row, its `gated_deltanet.LinearState` (constant size: no
KV cache), computed once per prompt by `prefill` and copied to the prompt's rows
(`prompt_states_to_rows`), then advanced one token per decode step by the recurrent form.

Dimension key (docs/dimensions.md): B prompts, G samples per prompt, R = B * G rows, P prompt
length, T completion slots, Y layers, N heads, K kv heads, Q = N / K, J = G * Q queries of a prompt
per kv head, H head dim, C cache block.
"""

import dataclasses
import math

import chex
import flax
import jax
import jax.numpy as jnp

from typing import Any

from jtc.models import gated_deltanet
from jtc.models import layer_types
from jtc.models import layers
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig


@flax.struct.dataclass
class GroupCache:
  """The sampler's cache: one prompt block per prompt, one completion block per sample.

  Rows b*G .. b*G + G - 1 are the G samples of prompt b; they all read prompt b's block.

  Attributes:
    prompt_k_YBKPH, prompt_v_YBKPH: keys/values of the (left-padded) prompts.
    prompt_mask_BP: [B, P] bool, True on real prompt tokens.
    k_YRKHT: completion keys, stored transposed (the slots of a block contiguous); T here is
      the completion length rounded up to whole blocks.
    v_YRKTH: completion values.
    length: [] int32, completion slots written so far (the next one to write).
    linear: None, or (a hybrid) the linear-attention layers' `gated_deltanet.LinearState`
      with leading axes [Y_linear, R]: each row's own recurrent and convolution state.
  After `split_cache` the four key / value fields (and `linear`) are tuples of per-layer values.
  """
  prompt_k_YBKPH: jax.Array
  prompt_v_YBKPH: jax.Array
  prompt_mask_BP: jax.Array
  k_YRKHT: jax.Array
  v_YRKTH: jax.Array
  length: jax.Array
  linear: Any = None

  @property
  def group_size(self) -> int:
    return self.k_YRKHT.shape[1] // self.prompt_k_YBKPH.shape[1]


def prefill(params, config: ModelConfig, prompt_tokens_BP, prompt_mask_BP, *, num_samples: int,
            max_new_tokens: int, block_size: int = 128, row_sharding=None,
            return_routing: bool = False):
  """Runs the left-padded prompts once and builds the sampler's `GroupCache`.

  Args:
    prompt_tokens_BP: [B, P] int prompts, LEFT-padded.
    prompt_mask_BP: [B, P] 1 on real prompt tokens.
    num_samples: G rows per prompt in the completion cache.
    max_new_tokens: T completion slots (rounded up to whole blocks of `block_size`).
    block_size: C, completion slots per attention block in `decode_step`.
    row_sharding: None, or the prompts' activations and the cache constrained to it
      (`model_lib.constrain_rows`; the cache's R rows split even when the B prompts cannot).
    return_routing: also return the experts each prompt token was routed to in each layer,
      int [B, P, Y, W] (a mixture-of-experts model; None for a dense one).

  Returns:
    (logits_BV float32 of the token after each prompt, an empty-completion `GroupCache`
    (, experts_BPYW)).
  """
  chex.assert_rank([prompt_tokens_BP, prompt_mask_BP], 2)
  chex.assert_equal_shape([prompt_tokens_BP, prompt_mask_BP])
  c = config
  B, P = prompt_tokens_BP.shape
  C = min(block_size, max_new_tokens)
  T_pad = -(-max_new_tokens // C) * C
  sin_BLH, cos_BLH = layers.rope_sin_cos(model_lib.positions_from_mask(prompt_mask_BP), c)
  x_BPD = model_lib.constrain_rows(model_lib.embed_tokens(params, prompt_tokens_BP, c),
                                   row_sharding)
  x_BPD, states, routed = model_lib.trunk(params, dataclasses.replace(c, remat=False), x_BPD,
                                          sin_BLH, cos_BLH, prompt_mask_BP, return_kv=True)
  Y, R, K, H = layer_types.stack_sizes(c).get('attn', 0), B * num_samples, c.n_kv_heads, c.head_dim
  empty_YBKPH = jnp.zeros((Y, B, K, P, H), c.jnp_dtype)
  k_YBKPH, v_YBKPH = states.get('attn', (empty_YBKPH, empty_YBKPH))
  linear = states.get('linear_attn')
  if linear is not None:  # each prompt's final state, copied to its G rows
    linear = prompt_states_to_rows(linear, jnp.arange(R) // num_samples)
  # Prompts are left-padded, so the last column predicts the first new token; only its
  # logits are computed (never [B, P, V]).
  logits_BV = model_lib.logits(params, c, model_lib.final_norm(params, x_BPD[:, -1:], c))[:, 0]
  cache = GroupCache(prompt_k_YBKPH=k_YBKPH.astype(c.jnp_dtype),
                     prompt_v_YBKPH=v_YBKPH.astype(c.jnp_dtype),
                     prompt_mask_BP=prompt_mask_BP.astype(bool), k_YRKHT=jnp.zeros(
                         (Y, R, K, H, T_pad), c.jnp_dtype), v_YRKTH=jnp.zeros(
                             (Y, R, K, T_pad, H), c.jnp_dtype), length=jnp.zeros(
                                 (), jnp.int32), linear=linear)
  cache = model_lib.constrain_rows(cache, row_sharding)
  if return_routing:
    return logits_BV, cache, None if routed is None else routed.experts_BLW.transpose(1, 2, 0, 3)
  return logits_BV, cache


def prompt_states_to_rows(linear, prompt_of_R):
  """Linear-attention states [Y_linear, B, ...] of B prompts -> [Y_linear, R, ...]: row r gets
  prompt ``prompt_of_R[r]``'s state (a copy; the rows then advance independently). The
  sampler's groups use prompt_of_R = r // G."""
  return jax.tree.map(lambda x: jnp.take(x, prompt_of_R, axis=1), linear)


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

  Part 1: the G rows of prompt b read prompt b's keys once ([B, K, J, P] scores, J = G * Q).
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

  # The G*Q queries of prompt b and kv head k against that head's P prompt slots, as products
  # summed in float32 (one fused pass over the prompt block; see `block` below).
  f32 = lambda x: x.astype(jnp.float32)
  q_BKJH = q_R1NH.reshape(B, G, K, Q, H).transpose(0, 2, 1, 3, 4).reshape(B, K, G * Q, H)
  scores_BKJP = jnp.sum(f32(q_BKJH)[:, :, :, None] * f32(prompt_k_BKPH)[:, :, None],
                        axis=-1) * scale
  scores_BKJP = jnp.where(prompt_mask_BP[:, None, None, :], scores_BKJP, layers.MASKED)
  m1_BKJ = jnp.max(scores_BKJP, axis=-1)
  p_BKJP = jnp.exp(scores_BKJP - m1_BKJ[..., None])
  l1_BKJ = jnp.sum(p_BKJP, axis=-1)
  o1_BKJH = jnp.sum(p_BKJP[..., None] * f32(prompt_v_BKPH)[:, :, None], axis=-2)
  to_rows = lambda x_BKJ_: x_BKJ_.reshape(B, K, G, Q, *x_BKJ_.shape[3:]).swapaxes(1, 2).reshape(
      R, K, Q, *x_BKJ_.shape[3:])
  m1_RKQ, l1_RKQ, o1_RKQH = to_rows(m1_BKJ), to_rows(l1_BKJ), to_rows(o1_BKJH)

  q_RKQH = q_R1NH.reshape(R, K, Q, H)

  def block(j, state):
    start = j * C
    kt_RKHC, v_RKCH = read_block(start)
    # q . k as a product summed over H: keys are stored [.., H, T] so that the C slots of a
    # block are contiguous for every (row, head, h) and the sum vectorises over them.
    scores_RKQC = jnp.sum(
        q_RKQH[..., None].astype(jnp.float32) * kt_RKHC[:, :, None].astype(jnp.float32),
        axis=-2) * scale
    live_C = start + jnp.arange(C) <= length
    scores_RKQC = jnp.where(live_C, scores_RKQC, layers.MASKED)
    return _online_update(state, scores_RKQC, v_RKCH)

  init = (jnp.full((R, K, Q), layers.MASKED, jnp.float32), jnp.zeros(
      (R, K, Q), jnp.float32), jnp.zeros((R, K, Q, H), jnp.float32))
  m2_RKQ, l2_RKQ, o2_RKQH = jax.lax.fori_loop(0, length // C + 1, block, init)

  m_RKQ = jnp.maximum(m1_RKQ, m2_RKQ)
  w1_RKQ, w2_RKQ = jnp.exp(m1_RKQ - m_RKQ), jnp.exp(m2_RKQ - m_RKQ)
  out_RKQH = ((o1_RKQH * w1_RKQ[..., None] + o2_RKQH * w2_RKQ[..., None]) /
              (l1_RKQ * w1_RKQ + l2_RKQ * w2_RKQ)[..., None])
  return out_RKQH.reshape(R, 1, N, H).astype(dt)


def split_layers(params) -> dict:
  """`params` with each stack of 'layers' as a tuple of its per-layer trees (slices of the
  stacked arrays, `layer_types.split_stacks`).

  Made once, outside a decode loop, this lets `decode_step` run its layers as a Python loop
  over separate arrays: on XLA:CPU a dynamic slice of a stacked weight that feeds a matmul is
  copied every step, which a decode step (bandwidth-bound) pays for in full."""
  return {**params, 'layers': layer_types.split_stacks(params['layers'])}


def split_cache(cache: GroupCache) -> GroupCache:
  """The same cache with its four key / value arrays (and a hybrid's linear states) as tuples
  of per-layer values (the layout `decode_step` uses with `split_layers` params: each layer
  writes and reads its own buffers)."""
  split = lambda x: tuple(x[i] for i in range(x.shape[0]))
  linear = cache.linear
  if linear is not None:
    linear = layer_types.split_stacks({'linear_attn': linear})['linear_attn']
  return cache.replace(prompt_k_YBKPH=split(cache.prompt_k_YBKPH),
                       prompt_v_YBKPH=split(cache.prompt_v_YBKPH), k_YRKHT=split(cache.k_YRKHT),
                       v_YRKTH=split(cache.v_YRKTH), linear=linear)


def decode_step(params, config: ModelConfig, tokens_R, positions_R, cache: GroupCache, *,
                block_size: int = 128, row_sharding=None, return_routing: bool = False):
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
    row_sharding: as in `prefill` (the rows' activations).
    return_routing: also return the experts the fed tokens were routed to in each layer, int
      [R, Y, W] (a mixture-of-experts model; None for a dense one).

  Returns:
    (logits_RV float32 of the next token, the cache with length + 1(, experts_RYW)).
  """
  chex.assert_rank([tokens_R, positions_R], 1)
  chex.assert_equal_shape([tokens_R, positions_R])
  c = config
  per_layer = isinstance(next(iter(params['layers'].values())), (tuple, list))
  if per_layer != isinstance(cache.k_YRKHT, (tuple, list)):
    raise ValueError('decode_step: split_layers(params) goes with split_cache(cache), and '
                     'stacked params with a stacked cache')
  t = cache.length
  sin_BLH, cos_BLH = layers.rope_sin_cos(positions_R[:, None], c)
  x_R1D = model_lib.constrain_rows(model_lib.embed_tokens(params, tokens_R[:, None], c),
                                   row_sharding)

  def attention_step(kind, p, x_R1D, prompt_k_BKPH, prompt_v_BKPH, k_cache, v_cache, lead):
    """One full-attention block; `k_cache`, `v_cache` are this layer's ([R, K, H, T'],
    [R, K, T', H]) or, with a layer index in `lead`, the stacked ([Y, ...]) completion caches.
    The new key/value go to slot t first, then blocks of C slots are read from the updated
    buffers. Returns (x, (k_cache, v_cache))."""
    C = min(block_size, v_cache.shape[-2])  # v: [(Y,) R, K, T', H]

    def read(kv, start):
      kt, v = kv
      kt = jax.lax.dynamic_slice(kt, lead + (0, 0, 0, start),
                                 (1,) * len(lead) + kt.shape[len(lead):-1] + (C,))
      v = jax.lax.dynamic_slice(v, lead + (0, 0, start, 0),
                                (1,) * len(lead) + v.shape[len(lead):-2] + (C, v.shape[-1]))
      return (kt[0], v[0]) if lead else (kt, v)

    def attend(q_R1NH, k_R1KH, v_R1KH):
      kt_RKH1 = k_R1KH.transpose(0, 2, 3, 1)
      v_RK1H = v_R1KH.transpose(0, 2, 1, 3)
      expand = (lambda x: x[None]) if lead else (lambda x: x)
      written = (jax.lax.dynamic_update_slice(k_cache,
                                              expand(kt_RKH1).astype(k_cache.dtype),
                                              lead + (0, 0, 0, t)),
                 jax.lax.dynamic_update_slice(v_cache,
                                              expand(v_RK1H).astype(v_cache.dtype),
                                              lead + (0, 0, t, 0)))
      out_R1NH = _group_attention(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, cache.prompt_mask_BP,
                                  lambda start: read(written, start), t, C, c)
      return out_R1NH, written

    mixer = layers.attention_mixer(p['attn'], sin_BLH, cos_BLH, attend, c)
    x_R1D, aux = layers.block(p, x_R1D, mixer, c, kind)
    return x_R1D, aux['attn'], aux.get('mlp')

  def linear_step(kind, p, x_R1D, state):
    """One linear-attention block advancing the rows' states by one token (recurrent form)."""
    ones_R1 = jnp.ones(x_R1D.shape[:2], jnp.int32)
    mixer = lambda h_R1D: gated_deltanet.mix(p['linear_attn'], h_R1D, ones_R1, c, state, form=
                                             'recurrent')
    x_R1D, aux = layers.block(p, x_R1D, mixer, c, kind)
    return x_R1D, aux['linear_attn'], aux.get('mlp')

  prompt_kv = {'attn': (cache.prompt_k_YBKPH, cache.prompt_v_YBKPH)}
  if per_layer:
    states = {'attn': tuple(zip(cache.k_YRKHT, cache.v_YRKTH))}
    if cache.linear is not None:
      states['linear_attn'] = cache.linear

    def layer_fn(kind, x_R1D, layer, _):
      p, prompt, state = layer
      if kind.mixer == 'linear_attention':
        x_R1D, new, routed = linear_step(kind, p, x_R1D, state['linear_attn'])
        out = {'linear_attn': new}
      else:
        (k_cache, v_cache), (prompt_k, prompt_v) = state['attn'], prompt['attn']
        x_R1D, new, routed = attention_step(kind, p, x_R1D, prompt_k, prompt_v, k_cache, v_cache,
                                            ())
        out = {'attn': new}
      return x_R1D, out if routed is None else {**out, 'mlp': routed}

    split_prompt = {'attn': tuple(zip(*prompt_kv['attn']))}
    x_R1D, out = layer_types.loop_layers(layer_fn, x_R1D, (params['layers'], split_prompt, states),
                                         c)
    k, v = (tuple(kv) for kv in zip(*out['attn'])) if 'attn' in out else ((), ())
    linear = out.get('linear_attn')
    routed = None if 'mlp' not in out else jax.tree.map(lambda *xs: jnp.stack(xs), *out['mlp'])
  else:

    def layer_fn(kind, carry, layer, rows):
      x_R1D, k_all, v_all, linear_all = carry
      p, prompt = layer
      if kind.mixer == 'linear_attention':
        i = rows['linear_attn']
        state = jax.tree.map(lambda a: a[i], linear_all)
        x_R1D, state, routed = linear_step(kind, p, x_R1D, state)
        linear_all = jax.tree.map(lambda a, s: a.at[i].set(s.astype(a.dtype)), linear_all, state)
      else:
        x_R1D, (k_all, v_all), routed = attention_step(kind, p, x_R1D, *prompt['attn'], k_all,
                                                       v_all, (rows['attn'],))
      return (x_R1D, k_all, v_all, linear_all), ({} if routed is None else {'mlp': routed})

    carry = (x_R1D, cache.k_YRKHT, cache.v_YRKTH, cache.linear)
    (x_R1D, k, v, linear), out = layer_types.scan_layers(layer_fn, carry,
                                                         (params['layers'], prompt_kv), c)
    routed = out.get('mlp')
  logits_RV = model_lib.logits(params, c, model_lib.final_norm(params, x_R1D, c))[:, 0]
  cache = cache.replace(k_YRKHT=k, v_YRKTH=v, length=t + 1, linear=linear)
  if return_routing:  # routed.experts_BLW: [Y, R, 1, W]
    return logits_RV, cache, None if routed is None else routed.experts_BLW[:, :, 0].swapaxes(0, 1)
  return logits_RV, cache
