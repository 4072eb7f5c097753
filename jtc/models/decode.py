"""Decoding for the sampler: prefill each prompt once, then decode steps against a `GroupCache`.

`GroupCache` holds the prompt's keys/values ONCE per prompt [Y, B, K, P, H], shared by its G
samples, plus each sample's own completion keys/values [Y, B*G, K, ...]. `decode_step` attends
from the G rows of a group to the shared prompt block (one read per prompt) and to the live
prefix of their own completion cache, in fixed-size blocks up to the current length (a
`jax.lax.fori_loop`), combining the parts with an online softmax; the layers run as the model's
scan or, with `split_layers` / `split_cache`, as an unrolled loop (faster on XLA:CPU).

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

from jtc.models import model as model_lib

from jtc.models import layers
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
  After `split_cache` the four key / value fields are tuples of Y per-layer arrays.
    length: [] int32, completion slots written so far (the next one to write).
  """
  prompt_k_YBKPH: jax.Array
  prompt_v_YBKPH: jax.Array
  prompt_mask_BP: jax.Array
  k_YRKHT: jax.Array
  v_YRKTH: jax.Array
  length: jax.Array

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
  x_BPD, (k_YBKPH, v_YBKPH), routed = model_lib.trunk(params, dataclasses.replace(c, remat=False),
                                                      x_BPD, sin_BLH, cos_BLH, prompt_mask_BP,
                                                      return_kv=True)
  # Prompts are left-padded, so the last column predicts the first new token; only its
  # logits are computed (never [B, P, V]).
  logits_BV = model_lib.logits(params, c, model_lib.final_norm(params, x_BPD[:, -1:], c))[:, 0]
  Y, R, K, H = c.n_layers, B * num_samples, c.n_kv_heads, c.head_dim
  cache = GroupCache(prompt_k_YBKPH=k_YBKPH.astype(c.jnp_dtype),
                     prompt_v_YBKPH=v_YBKPH.astype(c.jnp_dtype),
                     prompt_mask_BP=prompt_mask_BP.astype(bool), k_YRKHT=jnp.zeros(
                         (Y, R, K, H, T_pad), c.jnp_dtype), v_YRKTH=jnp.zeros(
                             (Y, R, K, T_pad, H), c.jnp_dtype), length=jnp.zeros((), jnp.int32))
  cache = model_lib.constrain_rows(cache, row_sharding)
  if return_routing:
    return logits_BV, cache, None if routed is None else routed.experts_BLW.transpose(1, 2, 0, 3)
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
  """`params` with 'layers' as a tuple of Y per-layer trees (slices of the stacked arrays).

  Made once, outside a decode loop, this lets `decode_step` run its layers as a Python loop
  over separate arrays: on XLA:CPU a dynamic slice of a stacked weight that feeds a matmul is
  copied every step, which a decode step (bandwidth-bound) pays for in full."""
  Y = jax.tree_util.tree_leaves(params['layers'])[0].shape[0]
  return {
      **params, 'layers':
          tuple(jax.tree_util.tree_map(lambda x, i=i: x[i], params['layers']) for i in range(Y))
  }


def split_cache(cache: GroupCache) -> GroupCache:
  """The same cache with its four key / value arrays as tuples of Y per-layer arrays (the layout
  `decode_step` uses with `split_layers` params: each layer writes and reads its own buffers)."""
  split = lambda x: tuple(x[i] for i in range(x.shape[0]))
  return cache.replace(prompt_k_YBKPH=split(cache.prompt_k_YBKPH),
                       prompt_v_YBKPH=split(cache.prompt_v_YBKPH), k_YRKHT=split(cache.k_YRKHT),
                       v_YRKTH=split(cache.v_YRKTH))


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
  per_layer = isinstance(params['layers'], (tuple, list))
  if per_layer != isinstance(cache.k_YRKHT, (tuple, list)):
    raise ValueError('decode_step: split_layers(params) goes with split_cache(cache), and '
                     'stacked params with a stacked cache')
  C = min(block_size, cache.v_YRKTH[0].shape[-2])  # v: [(Y,) R, K, T', H]
  t = cache.length
  sin_BLH, cos_BLH = layers.rope_sin_cos(positions_R[:, None], c)
  x_R1D = model_lib.constrain_rows(model_lib.embed_tokens(params, tokens_R[:, None], c),
                                   row_sharding)

  def layer_step(x_R1D, layer, prompt_k_BKPH, prompt_v_BKPH, k_cache, v_cache, i):
    """One block; `k_cache`, `v_cache` are this layer's ([R, K, H, T'], [R, K, T', H]) or, with
    a layer index `i`, the stacked ([Y, ...]) completion caches. The new key/value go to slot
    t first, then blocks of C slots are read from the updated buffers."""
    lead = () if i is None else (i,)

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

    return layers.block(layer, x_R1D, sin_BLH, cos_BLH, attend, c)

  if per_layer:
    ks, vs, routed = [], [], []
    for i, layer in enumerate(params['layers']):
      x_R1D, (k_i, v_i), routed_i = layer_step(x_R1D, layer, cache.prompt_k_YBKPH[i],
                                               cache.prompt_v_YBKPH[i], cache.k_YRKHT[i],
                                               cache.v_YRKTH[i], None)
      ks.append(k_i)
      vs.append(v_i)
      routed.append(routed_i)
    k, v = tuple(ks), tuple(vs)
    routed = None if routed[0] is None else jax.tree.map(lambda *xs: jnp.stack(xs), *routed)
  else:

    def body(carry, xs):
      x_R1D, k_all, v_all = carry
      layer, prompt_k_BKPH, prompt_v_BKPH, i = xs
      x_R1D, (k_all, v_all), routed = layer_step(x_R1D, layer, prompt_k_BKPH, prompt_v_BKPH, k_all,
                                                 v_all, i)
      return (x_R1D, k_all, v_all), routed

    xs = (params['layers'], cache.prompt_k_YBKPH, cache.prompt_v_YBKPH, jnp.arange(c.n_layers))
    (x_R1D, k, v), routed = jax.lax.scan(body, (x_R1D, cache.k_YRKHT, cache.v_YRKTH), xs)
  logits_RV = model_lib.logits(params, c, model_lib.final_norm(params, x_R1D, c))[:, 0]
  cache = cache.replace(k_YRKHT=k, v_YRKTH=v, length=t + 1)
  if return_routing:  # routed.experts_BLW: [Y, R, 1, W]
    return logits_RV, cache, None if routed is None else routed.experts_BLW[:, :, 0].swapaxes(0, 1)
  return logits_RV, cache
