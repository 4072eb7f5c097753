"""The geometry DelTA works in (arXiv 2605.21467): token-gradient proxies, chunked passes over
them, and the per-token margins, assignments and selections of `jtc.objectives.delta.token_coefficients`.

The proxy of a token's gradient ``v_{i,t}`` is the LM-head output-row gradient
``grad_{W_y} log p(y) = (1 - p(y)) h`` (DelTA Implementation), computed chunk by chunk from the
hidden states of the behaviour pass: only one [B, chunk, D] block of v ever exists, and the
chunks run along every row's tokens, so rows sharded over devices stay where they are.

Dimension key (docs/dimensions.md):
  B: rows  T: completion length  U: flattened tokens B*T  C: tokens per chunk (of every row)
  D: model dim  V: vocabulary  W: top-k candidates
  I: scope segments (1 for scope='batch', B // G for scope='group')
  Z: side (0 = positive advantage, 1 = negative advantage)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

POS, NEG = 0, 1
GAMMA_FLOOR = 1e-12

# ----------------------------------------------------------------------------------
# Token-gradient proxies.
# ----------------------------------------------------------------------------------


def lm_head_proxy(hidden_CD: Array, token_logps_C: Array) -> Array:
  """LM-head output-row gradient ``grad_{W_y} log p(y) = (1 - p(y)) h`` (float32).

    DelTA Implementation paragraph: the layer-restricted proxy of ``v_{i,t}``. ``1 - p`` is
    computed as ``-expm1(log p)``, which keeps its relative precision when the model is sure of
    y (in float32 ``1 - exp(log p)`` keeps ~3 digits at log p = -1e-4 and is 0 above -3e-8).
    Args: hidden_CD [..., D] final-normed hidden state; token_logps_C [...] log p(y).
    """
  h = hidden_CD.astype(jnp.float32)
  return -jnp.expm1(token_logps_C.astype(jnp.float32))[..., None] * h


def topk_hidden_proxy(hidden_CD: Array, token_ids_C: Array, unembed_VD: Array, *,
                      topk: int) -> Array:
  """Top-K hidden-gradient proxy ``W_y - sum_{k in topK(p)} p_k W_k`` (float32).

    DelTA Table 4 "Top-K hidden-gradient proxy". The digest names but does not define
    it; we use the gradient of log p(y) with respect to the hidden state,
    ``grad_h log softmax(W h)_y = W_y - sum_v p_v W_v``, with the expectation truncated
    to the k most likely tokens (not renormalised). With k = V it is the exact
    hidden-state gradient. Assumes logits = h @ W^T (no bias, no soft-capping).

    Args: hidden_CD [C, D]; token_ids_C [C] sampled ids y; unembed_VD [V, D].
    Memory: one [C, V] float32 logits block per call.
    """
  chex.assert_rank([hidden_CD, token_ids_C, unembed_VD], [2, 1, 2])
  w_VD = unembed_VD.astype(jnp.float32)
  logits_CV = jnp.einsum('CD,VD->CV', hidden_CD.astype(jnp.float32), w_VD)
  probs_CV = jax.nn.softmax(logits_CV, axis=-1)
  top_p_CW, top_ids_CW = jax.lax.top_k(probs_CV, topk)
  rows_C1 = jnp.arange(probs_CV.shape[0])[:, None]
  coef_CV = jnp.zeros_like(probs_CV).at[rows_C1, top_ids_CW].set(top_p_CW)
  return w_VD[token_ids_C] - jnp.einsum('CV,VD->CD', coef_CV, w_VD)


# ----------------------------------------------------------------------------------
# Chunked passes over the flattened tokens.
# ----------------------------------------------------------------------------------


def scan_chunks(length: int, chunk: int, body: Callable, init: Any) -> Any:
  """Runs ``carry = body(carry, start, fresh_C)`` over chunks of ``chunk`` positions of an axis
  of ``length``.

    Chunks start at ``min(i * chunk, length - chunk)`` so every slice is in bounds without
    padding (which would copy the hidden states); ``fresh_C`` marks positions not already
    covered by a previous chunk, so accumulations count each position once.
    """
  num_chunks = -(-length // chunk)

  def step(carry, i):
    start = jnp.minimum(i * chunk, length - chunk)
    fresh_C = (start + jnp.arange(chunk)) >= i * chunk
    return body(carry, start, fresh_C), None

  carry, _ = jax.lax.scan(step, init, jnp.arange(num_chunks))
  return carry


def take_chunk(x_BT: Array, start: Array, chunk: int) -> Array:
  """Positions [start, start + chunk) of axis 1 of [B, T, ...] (every row's)."""
  return jax.lax.dynamic_slice_in_dim(x_BT, start, chunk, axis=1)


def chunk_proxies(hidden_BTD: Array, token_logps_BT: Array, *, chunk: int, proxy: str = 'lm_head',
                  topk: int = 0, unembed_VD: Optional[Array] = None,
                  token_ids_BT: Optional[Array] = None) -> Callable:
  """``v_fn(start)``: the proxies v [B, C, D] of positions [start, start + C) of every row,
    `lm_head_proxy` or (proxy='topk_hidden') `topk_hidden_proxy`, row by row (vmap) so that
    sharded rows stay where they are."""
  # Note: XLA:CPU upcasts a bfloat16 loop operand to float32 once, before the loop (a float32
  # copy of all hidden states); pass float32 hidden states on CPU.
  hidden_chunk = lambda start: take_chunk(hidden_BTD, start, chunk)
  if proxy == 'lm_head':
    return lambda start: lm_head_proxy(hidden_chunk(start), take_chunk(
        token_logps_BT, start, chunk))
  topk_rows = jax.vmap(functools.partial(topk_hidden_proxy, unembed_VD=unembed_VD, topk=topk))
  return lambda start: topk_rows(hidden_chunk(start), take_chunk(token_ids_BT, start, chunk))


def proxy_pass(v_fn: Callable, seg2_B: Array, *, length: int, chunk: int, num_seg: int, dim: int,
               mu_BZD: Optional[Array] = None, weight_BT: Optional[Array] = None,
               want_sq: bool = False, constrain: Callable = lambda x: x) -> dict:
  """One pass over v = v_fn(start) [B, C, D] (positions [start, start + C) of every row),
    computing any of:

    * ``proj_UZ``: v . mu_{seg, Z} for both sides of the row's own scope segment (``mu_BZD``:
      each row's two centroids);
    * ``sums_IZD``: sum_t weight_t v_t per (segment, side) of the row (``seg2_B`` = 2 seg +
      side);
    * ``sq_U``: ||v_t||^2.

    The rows stay whole on their devices: the chunks run along the tokens of every row, the
    per-token outputs are [B, T, ...] and the sums are accumulated per row, then summed over
    the rows of each segment once (a reduction across the devices that hold them); no chip
    ever holds another chip's rows. ``constrain``: the [B, ...] values constrained to the
    rows' sharding (`jtc.models.model.constrain_rows`).
    """
  init = {}
  num_rows = seg2_B.shape[0]
  if mu_BZD is not None:
    init['proj_BTZ'] = jnp.zeros((num_rows, length, 2), jnp.float32)
  if weight_BT is not None:
    init['sums_BD'] = jnp.zeros((num_rows, dim), jnp.float32)
  if want_sq:
    init['sq_BT'] = jnp.zeros((num_rows, length), jnp.float32)
  init = constrain(init)

  def body(carry, start, fresh_C):
    v_BCD = constrain(v_fn(start))
    out = dict(carry)
    if mu_BZD is not None:
      proj_BCZ = jnp.einsum('BCD,BZD->BCZ', v_BCD, mu_BZD)
      out['proj_BTZ'] = jax.lax.dynamic_update_slice_in_dim(carry['proj_BTZ'], proj_BCZ, start,
                                                            axis=1)
    if weight_BT is not None:
      w_BC = jnp.where(fresh_C, take_chunk(weight_BT, start, chunk), 0.0)
      out['sums_BD'] = carry['sums_BD'] + jnp.einsum('BC,BCD->BD', w_BC, v_BCD)
    if want_sq:
      out['sq_BT'] = jax.lax.dynamic_update_slice_in_dim(carry['sq_BT'],
                                                         jnp.sum(v_BCD * v_BCD, axis=-1), start,
                                                         axis=1)
    return constrain(out)

  carry = scan_chunks(length, chunk, body, init)
  out = {}
  if mu_BZD is not None:
    out['proj_UZ'] = carry['proj_BTZ'].reshape(-1, 2)
  if weight_BT is not None:  # rows -> their (segment, side): the one sum across devices
    onehot_BIZ = jax.nn.one_hot(seg2_B, 2 * num_seg, dtype=jnp.float32).reshape(-1, num_seg, 2)
    out['sums_IZD'] = jnp.einsum('BIZ,BD->IZD', onehot_BIZ, carry['sums_BD'])
  if want_sq:
    out['sq_U'] = carry['sq_BT'].reshape(-1)
  return out


# ----------------------------------------------------------------------------------
# Per-token scalar algebra (segments = scope segment x side).
# ----------------------------------------------------------------------------------


def seg_sum(x_U: Array, seg2_U: Array, num_seg: int) -> Array:
  """Sum per (scope segment, side) -> [I, Z]."""
  return jax.ops.segment_sum(x_U, seg2_U, num_segments=2 * num_seg).reshape(num_seg, 2)


def seg_mean_std(x_U: Array, on_U: Array, seg2_U: Array, num_seg: int):
  """Two-pass mean and population std of x over the tokens with on_U, per segment."""
  cnt_IZ = seg_sum(on_U.astype(jnp.float32), seg2_U, num_seg)
  safe_IZ = jnp.maximum(cnt_IZ, 1.0)
  mean_IZ = seg_sum(jnp.where(on_U, x_U, 0.0), seg2_U, num_seg) / safe_IZ
  dev_U = jnp.where(on_U, x_U - mean_IZ.reshape(-1)[seg2_U], 0.0)
  var_IZ = seg_sum(dev_U * dev_U, seg2_U, num_seg) / safe_IZ
  return mean_IZ, jnp.sqrt(var_IZ)


def margins(proj_UZ: Array, sq_U: Array, mu_IZD: Array, seg_U: Array, side_U: Array,
            scored_U: Array, *, within_side_only: bool, num_seg: int) -> Array:
  """Own-side margin per token.

    Distances are ``d_Z = ||v||^2 - 2 v.mu_Z + ||mu_Z||^2``. DelTA (eq:DelTA-alpha)
    uses ``m = d_opp - d_own``; the ``||v||^2`` terms cancel, so it is computed as
    ``2 (v.mu_own - v.mu_opp) + ||mu_opp||^2 - ||mu_own||^2`` (no cancellation error).
    Within-side only (Table 4): ``m = mean_side(d_own) - d_own`` (own-side centrality:
    positive for tokens closer than average to their own centroid).
    """
  musq_IZ = jnp.sum(mu_IZD * mu_IZD, axis=-1)
  musq_UZ = musq_IZ[seg_U]
  own_U = side_U
  opp_U = 1 - side_U
  # Column z_U of each row (a select: elementwise, so the tokens stay on their devices).
  take = lambda x_UZ, z_U: jnp.where(z_U == POS, x_UZ[:, POS], x_UZ[:, NEG])
  if not within_side_only:
    return (2.0 * (take(proj_UZ, own_U) - take(proj_UZ, opp_U)) + take(musq_UZ, opp_U) -
            take(musq_UZ, own_U))
  d_own_U = sq_U - 2.0 * take(proj_UZ, own_U) + take(musq_UZ, own_U)
  seg2_U = 2 * seg_U + side_U
  mean_IZ, _ = seg_mean_std(d_own_U, scored_U, seg2_U, num_seg)
  return mean_IZ.reshape(-1)[seg2_U] - d_own_U


def assign(margin_U: Array, scored_U: Array, seg2_U: Array, *, num_seg: int, gamma: Optional[float],
           unit_I: Optional[Array], soft_assignment: bool):
  """alpha = sigmoid(m / gamma_side) (eq:DelTA-alpha) or hard 1[m > 0] (w/o h(alpha)).

    Adaptive gamma (gamma=None): the spread of the margins, i.e. the population std of
    m over the scored tokens of the same side and scope segment (floored at 1e-12).
    Fixed gamma: gamma * unit_I, the same for both sides (unit_I: E||v||^2 per segment).
    Returns (alpha_U, gamma_IZ).
    """
  if gamma is None:
    _, std_IZ = seg_mean_std(margin_U, scored_U, seg2_U, num_seg)
    gamma_IZ = jnp.maximum(std_IZ, GAMMA_FLOOR)
  else:
    gamma_IZ = jnp.broadcast_to(jnp.maximum(gamma * unit_I, GAMMA_FLOOR)[:, None], (num_seg, 2))
  if soft_assignment:
    alpha_U = jax.nn.sigmoid(margin_U / gamma_IZ.reshape(-1)[seg2_U])
  else:
    alpha_U = (margin_U > 0).astype(jnp.float32)
  return alpha_U, gamma_IZ


def select(score_U: Array, valid_U: Array, seg_U: Array, *, num_seg: int,
           descending: bool) -> Array:
  """Hard mask keeping ceil(n/2) of the n valid tokens of every segment by score
    (Figure 3). Segments are any labels in [0, num_seg); ties broken by token index.
    """
  num_tokens = score_U.shape[0]
  key_U = -score_U if descending else score_U
  order_U = jnp.lexsort((key_U, ~valid_U, seg_U))
  pos_U = jnp.zeros((num_tokens,),
                    jnp.int32).at[order_U].set(jnp.arange(num_tokens, dtype=jnp.int32))
  size_I = jax.ops.segment_sum(jnp.ones_like(seg_U), seg_U, num_segments=num_seg)
  start_I = jnp.cumsum(size_I) - size_I
  rank_U = pos_U - start_I[seg_U]
  n_valid_I = jax.ops.segment_sum(valid_U.astype(jnp.int32), seg_U, num_segments=num_seg)
  n_keep_I = (n_valid_I + 1) // 2
  return valid_U & (rank_U < n_keep_I[seg_U])
