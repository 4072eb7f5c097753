"""Decoding for the sampler: prefill each prompt once, then decode steps against a `GroupCache`.

`GroupCache` holds the prompt's keys/values ONCE per prompt [Y, B, K, P, H] plus each row's own
completion keys/values [Y, R, K, ...]. Its rows are either the R = B * G samples of the prompts,
row b*G + g reading prompt b (the `static` scheduler: one shared completion length), or the
decode slots of the `continuous` scheduler (`jtc.models.decode_loop`), each with its own length
and prompt (`prompt_R`), restarted on another prompt by `start_rows`. `decode_step` attends from
each row to its prompt's block (with shared lengths the G rows of a group read it once; slots
gather their prompt's) and to the live prefix of its own completion cache, in fixed-size blocks
up to the longest live length (a `jax.lax.fori_loop`), combining the parts with an online
softmax; the layers run as the model's scan or, with `split_layers` / `split_cache`, as an
unrolled loop (faster on XLA:CPU).

In a hybrid (`jtc.models.layer_types`) Y counts the full-attention layers only; each
linear-attention layer keeps, per row, its `gated_deltanet.LinearState` (constant size: no
KV cache), computed once per prompt by `prefill` and copied to the prompt's rows
(`prompt_states_to_rows`; a slot's again by `start_rows`), then advanced one token per decode
step by the recurrent form.

Dimension key (docs/dimensions.md): B prompts, G samples per prompt, R the cache's rows (B * G
samples, or decode slots), P prompt length, T completion slots, Y layers, N heads, K kv heads,
Q = N / K, J = G * Q queries of a prompt per kv head, H head dim, C cache block, D model, V vocab.
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

  Attributes:
    prompt_k_YBKPH, prompt_v_YBKPH: keys/values of the (left-padded) prompts.
    prompt_mask_BP: [B, P] bool, True on real prompt tokens.
    k_YRKHT: completion keys, stored transposed (the slots of a block contiguous); T here is
      the completion length rounded up to whole blocks.
    v_YRKTH: completion values.
    length: completion slots written so far (the next one to write): [] int32 shared by every
      row (rows b*G .. b*G + G - 1 are the samples of prompt b), or [R] int32 per row.
    prompt_R: None (shared length), or [R] int32, the prompt each row reads (per-row lengths).
    linear: None, or (a hybrid) the linear-attention layers' `gated_deltanet.LinearState`
      with leading axes [Y_linear, R]: each row's own recurrent and convolution state.
    prompt_linear: None, or (a hybrid's per-row cache) each prompt's final `LinearState`
      [Y_linear, B, ...], which a row restarted on prompt b starts from (`start_rows`).
  After `split_cache` the four key / value fields (and the linear states) are tuples of
  per-layer values.
  """
  prompt_k_YBKPH: jax.Array
  prompt_v_YBKPH: jax.Array
  prompt_mask_BP: jax.Array
  k_YRKHT: jax.Array
  v_YRKTH: jax.Array
  length: jax.Array
  linear: Any = None
  prompt_R: jax.Array | None = None
  prompt_linear: Any = None

  @property
  def per_row(self) -> bool:
    """True for the decode slots of the continuous scheduler (own lengths and prompts)."""
    return self.prompt_R is not None


def prefill(params, config: ModelConfig, prompt_tokens_BP, prompt_mask_BP, *, num_samples: int,
            max_new_tokens: int, block_size: int = 128, row_sharding=None, slots: int | None = None,
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
    slots: None (R = B * G rows sharing one length), or R = ``slots`` rows with their own
      lengths and prompts, all empty (length 0, prompt 0) until `start_rows` starts them (a
      hybrid's cache then also keeps each prompt's final linear states, `prompt_linear`).
    return_routing: also return the experts each prompt token was routed to in each layer,
      int [B, P, Y, W] (a mixture-of-experts model; None for a dense one).

  Returns:
    (logits_BV float32 of the token after each prompt, an empty `GroupCache`(, experts_BPYW)).
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
  Y, K, H = layer_types.stack_sizes(c).get('attn', 0), c.n_kv_heads, c.head_dim
  R = B * num_samples if slots is None else slots
  zeros = lambda *shape: jnp.zeros(shape, c.jnp_dtype)
  k_YBKPH, v_YBKPH = states.get('attn', (zeros(Y, B, K, P, H),) * 2)
  per_row = None if slots is None else jnp.zeros((R,), jnp.int32)
  prompt_linear = linear = states.get('linear_attn')
  if linear is not None:  # each prompt's final state, copied to its G rows (slots: prompt 0's)
    linear = prompt_states_to_rows(linear,
                                   jnp.arange(R) // num_samples if slots is None else per_row)
  # Prompts are left-padded, so the last column predicts the first new token; only its
  # logits are computed (never [B, P, V]).
  logits_BV = model_lib.logits(params, c, model_lib.final_norm(params, x_BPD[:, -1:], c))[:, 0]
  cache = GroupCache(prompt_k_YBKPH=k_YBKPH.astype(c.jnp_dtype),
                     prompt_v_YBKPH=v_YBKPH.astype(c.jnp_dtype),
                     prompt_mask_BP=prompt_mask_BP.astype(bool), k_YRKHT=zeros(Y, R, K, H, T_pad),
                     v_YRKTH=zeros(Y, R, K, T_pad, H), length=jnp.zeros(
                         (), jnp.int32) if slots is None else per_row, linear=linear,
                     prompt_R=per_row, prompt_linear=None if slots is None else prompt_linear)
  cache = model_lib.constrain_rows(cache, row_sharding)
  if return_routing:
    return logits_BV, cache, None if routed is None else routed.experts_BLW.transpose(1, 2, 0, 3)
  return logits_BV, cache


def prompt_states_to_rows(linear, prompt_of_R, axis: int = 1):
  """Linear-attention states [Y_linear, B, ...] of B prompts -> [Y_linear, R, ...]: row r gets
  prompt ``prompt_of_R[r]``'s state (a copy; the rows then advance independently). The
  sampler's groups use prompt_of_R = r // G. ``axis`` 0: per-layer states (`split_cache`)."""
  return jax.tree.map(lambda x: jnp.take(x, prompt_of_R, axis=axis), linear)


def start_rows(cache: GroupCache, start_R, prompt_R) -> GroupCache:
  """The rows where ``start_R`` ([R] bool) begin a new completion of prompt ``prompt_R``
  ([R] int): no completion slot of theirs is live, their linear states (a hybrid) are the
  prompt's final ones. Per-row caches only (`prefill` with ``slots``); every per-row field a
  layer type adds is reset here."""
  if not cache.per_row:
    raise ValueError('start_rows: a cache with one shared length (prefill without slots) '
                     'cannot start single rows')
  prompt_R = jnp.where(start_R, prompt_R, cache.prompt_R).astype(jnp.int32)
  linear = cache.linear
  if linear is not None:
    axis = 0 if isinstance(linear, (tuple, list)) else 1  # per-layer or stacked [Y, R, ...]
    pick = lambda new, old: jnp.where(start_R.reshape(-1, *[1] * (old.ndim - axis - 1)), new, old)
    linear = jax.tree.map(pick, prompt_states_to_rows(cache.prompt_linear, prompt_R, axis), linear)
  return cache.replace(length=jnp.where(start_R, 0, cache.length), prompt_R=prompt_R, linear=linear)


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


def _prompt_part(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP):
  """Softmax statistics (m, l, o) of each row's query against its prompt's P slots; the G = R / B
  rows of prompt b are rows b*G .. b*G + G - 1 and read its block once ([B, K, J, P] scores,
  J = G * Q), as products summed in float32 (one fused pass over the prompt block)."""
  R, _, N, H = q_R1NH.shape
  B, K, P, _ = prompt_k_BKPH.shape
  G, Q = R // B, N // K
  f32 = lambda x: x.astype(jnp.float32)
  q_BKJH = q_R1NH.reshape(B, G, K, Q, H).transpose(0, 2, 1, 3, 4).reshape(B, K, G * Q, H)
  scores_BKJP = jnp.sum(f32(q_BKJH)[:, :, :, None] * f32(prompt_k_BKPH)[:, :, None],
                        axis=-1) / math.sqrt(H)
  scores_BKJP = jnp.where(prompt_mask_BP[:, None, None, :], scores_BKJP, layers.MASKED)
  m1_BKJ = jnp.max(scores_BKJP, axis=-1)
  p_BKJP = jnp.exp(scores_BKJP - m1_BKJ[..., None])
  l1_BKJ = jnp.sum(p_BKJP, axis=-1)
  o1_BKJH = jnp.sum(p_BKJP[..., None] * f32(prompt_v_BKPH)[:, :, None], axis=-2)
  to_rows = lambda x_BKJ_: x_BKJ_.reshape(B, K, G, Q, *x_BKJ_.shape[3:]).swapaxes(1, 2).reshape(
      R, K, Q, *x_BKJ_.shape[3:])
  return to_rows(m1_BKJ), to_rows(l1_BKJ), to_rows(o1_BKJH)


def _group_attention(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP, read_block, length,
                     n_blocks, block_size, config: ModelConfig):
  """One query per row against its prompt's block plus its own live completion prefix.

  `read_block(start) -> (kt_RKHC, v_RKCH)` reads completion slots start .. start + C - 1 of
  this layer (keys transposed, see `GroupCache`).

  Part 1 (`_prompt_part`): the rows against their prompts' slots. Part 2: the row's completion
  slots 0 .. length (inclusive: the new token is written already; ``length`` [] or [R]), in
  blocks of C slots, block j for j <= max(length) // C only (at most ``n_blocks``). The two parts
  are merged with the log-sum-exp identity softmax([a, b]) = [e^a, e^b] / (sum e^a + sum e^b).

  Returns out_R1NH in the compute dtype.
  """
  R, _, N, H = q_R1NH.shape
  K = prompt_k_BKPH.shape[1]
  C = block_size
  m1_RKQ, l1_RKQ, o1_RKQH = _prompt_part(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP)
  q_RKQH = q_R1NH.reshape(R, K, N // K, H)
  length_R111 = jnp.reshape(length, (-1, 1, 1, 1))

  def block(j, state):
    start = j * C
    kt_RKHC, v_RKCH = read_block(start)
    # q . k as a product summed over H: keys are stored [.., H, T] so that the C slots of a
    # block are contiguous for every (row, head, h) and the sum vectorises over them.
    scores_RKQC = jnp.sum(
        q_RKQH[..., None].astype(jnp.float32) * kt_RKHC[:, :, None].astype(jnp.float32),
        axis=-2) / math.sqrt(H)
    scores_RKQC = jnp.where(start + jnp.arange(C) <= length_R111, scores_RKQC, layers.MASKED)
    return _online_update(state, scores_RKQC, v_RKCH)

  init = (jnp.full((R, K, N // K), layers.MASKED,
                   jnp.float32), jnp.zeros((R, K, N // K),
                                           jnp.float32), jnp.zeros((R, K, N // K, H), jnp.float32))
  trips = jnp.minimum(jnp.max(length) // C + 1, n_blocks)
  m2_RKQ, l2_RKQ, o2_RKQH = jax.lax.fori_loop(0, trips, block, init)

  m_RKQ = jnp.maximum(m1_RKQ, m2_RKQ)
  w1_RKQ, w2_RKQ = jnp.exp(m1_RKQ - m_RKQ), jnp.exp(m2_RKQ - m_RKQ)
  out_RKQH = ((o1_RKQH * w1_RKQ[..., None] + o2_RKQH * w2_RKQ[..., None]) /
              (l1_RKQ * w1_RKQ + l2_RKQ * w2_RKQ)[..., None])
  return out_RKQH.reshape(R, 1, N, H).astype(config.jnp_dtype)


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
  per_layer = lambda s: None if s is None else layer_types.split_stacks({'linear_attn': s})[
      'linear_attn']
  return cache.replace(prompt_k_YBKPH=split(cache.prompt_k_YBKPH),
                       prompt_v_YBKPH=split(cache.prompt_v_YBKPH), k_YRKHT=split(cache.k_YRKHT),
                       v_YRKTH=split(cache.v_YRKTH), linear=per_layer(cache.linear),
                       prompt_linear=per_layer(cache.prompt_linear))


def _write(buf, new_RKH, length, time_axis, lead):
  """``buf`` (this layer's completion keys [R, K, H, T'] with ``time_axis`` 3, or values
  [R, K, T', H] with 2; stacked [Y, ...] behind a layer index ``lead`` = (i,)) with ``new_RKH``
  written at slot ``length``: [] for every row (one slice), or [R] per row (a scatter)."""
  new_RKH = new_RKH.astype(buf.dtype)
  if jnp.ndim(length) == 0:
    start = [length if a == time_axis else 0 for a in range(4)]
    update = jnp.expand_dims(new_RKH, time_axis)
    return jax.lax.dynamic_update_slice(buf, update[None] if lead else update,
                                        tuple(lead) + tuple(start))
  index = [length if a == time_axis else slice(None) for a in range(1, 4)]
  rows_R = jnp.arange(new_RKH.shape[0])
  return buf.at[tuple(lead) + (rows_R,) + tuple(index)].set(new_RKH, mode='drop')


def _read(buf, start, C, time_axis, lead):
  """Slots start .. start + C - 1 of this layer's completion keys or values (as `_write`)."""
  sizes = list(buf.shape[len(lead):])
  sizes[time_axis] = C
  offsets = [0] * len(sizes)
  offsets[time_axis] = start
  out = jax.lax.dynamic_slice(buf, tuple(lead) + tuple(offsets), (1,) * len(lead) + tuple(sizes))
  return out[0] if lead else out


def decode_step(params, config: ModelConfig, tokens_R, positions_R, cache: GroupCache, *,
                block_size: int = 128, row_sharding=None, return_routing: bool = False):
  """One new token per row: written at completion slot `cache.length` (shared or per row),
  attending to the row's prompt and to its completion slots 0 .. length.

  Args:
    params: parameters with stacked 'layers' (one `jax.lax.scan` over the layers: compile time
      flat in depth), or with 'layers' from `split_layers` together with a `split_cache`
      cache (a Python loop over per-layer arrays: no per-step weight copies on XLA:CPU,
      compile time linear in depth).
    tokens_R: [R] int, the token each of the cache's rows feeds.
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
    prompt_mask_BP = cache.prompt_mask_BP
    if cache.per_row:  # each row (slot) reads its own prompt's block
      take = lambda x: jnp.take(x, cache.prompt_R, axis=0)
      prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP = map(
          take, (prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP))

    def attend(q_R1NH, k_R1KH, v_R1KH):
      written = (_write(k_cache, k_R1KH[:, 0], t, 3, lead), _write(v_cache, v_R1KH[:, 0], t, 2,
                                                                   lead))
      read = lambda start: (_read(written[0], start, C, 3, lead),
                            _read(written[1], start, C, 2, lead))
      out_R1NH = _group_attention(q_R1NH, prompt_k_BKPH, prompt_v_BKPH, prompt_mask_BP, read, t,
                                  v_cache.shape[-2] // C, C, c)
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
