"""The geometry DelTA works in (arXiv 2605.21467): token-gradient proxies, chunked passes over
them, and the per-token margins, assignments and selections of `jtc.objectives.delta.token_coefficients`.

The proxy of a token's gradient ``v_{i,t}`` is the LM-head output-row gradient
``grad_{W_y} log p(y) = (1 - p(y)) h`` (DelTA Implementation), computed chunk by chunk from the
hidden states of the behaviour pass: only one [chunk, D] block of v ever exists.

Dimension key:
  N: flattened tokens B*T  C: tokens per chunk  D: model dim  V: vocabulary  K: top-k
  S: scope segments (1 for scope='batch', B // G for scope='group')
  Z: side (0 = positive advantage, 1 = negative advantage)
"""

from __future__ import annotations

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
    to the K most likely tokens (not renormalised). With K = V it is the exact
    hidden-state gradient. Assumes logits = h @ W^T (no bias, no soft-capping).

    Args: hidden_CD [C, D]; token_ids_C [C] sampled ids y; unembed_VD [V, D].
    Memory: one [C, V] float32 logits block per call.
    """
  chex.assert_rank([hidden_CD, token_ids_C, unembed_VD], [2, 1, 2])
  w_VD = unembed_VD.astype(jnp.float32)
  logits_CV = jnp.einsum('CD,VD->CV', hidden_CD.astype(jnp.float32), w_VD)
  probs_CV = jax.nn.softmax(logits_CV, axis=-1)
  top_p_CK, top_ids_CK = jax.lax.top_k(probs_CV, topk)
  rows_C1 = jnp.arange(probs_CV.shape[0])[:, None]
  coef_CV = jnp.zeros_like(probs_CV).at[rows_C1, top_ids_CK].set(top_p_CK)
  return w_VD[token_ids_C] - jnp.einsum('CV,VD->CD', coef_CV, w_VD)


# ----------------------------------------------------------------------------------
# Chunked passes over the flattened tokens.
# ----------------------------------------------------------------------------------


def scan_chunks(num_tokens: int, chunk: int, body: Callable, init: Any) -> Any:
  """Runs ``carry = body(carry, start, fresh_C)`` over chunks of ``chunk`` tokens.

    Chunks start at ``min(i * chunk, N - chunk)`` so every slice is in bounds without
    padding (which would copy the hidden states); ``fresh_C`` marks tokens not already
    covered by a previous chunk, so accumulations count each token once.
    """
  num_chunks = -(-num_tokens // chunk)

  def step(carry, i):
    start = jnp.minimum(i * chunk, num_tokens - chunk)
    fresh_C = (start + jnp.arange(chunk)) >= i * chunk
    return body(carry, start, fresh_C), None

  carry, _ = jax.lax.scan(step, init, jnp.arange(num_chunks))
  return carry


def take_chunk(x_N: Array, start: Array, chunk: int) -> Array:
  return jax.lax.dynamic_slice_in_dim(x_N, start, chunk, axis=0)


def proxy_pass(v_fn: Callable, seg_N: Array, side_N: Array, *, num_tokens: int, chunk: int,
               num_seg: int, dim: int, mu_SZD: Optional[Array] = None,
               weight_N: Optional[Array] = None, want_sq: bool = False) -> dict:
  """One chunked pass over v = v_fn(start) computing any of:

    * ``proj_NZ``: v . mu_{seg, Z} for both sides of the token's own scope segment;
    * ``sums_SZD``: sum_t weight_t v_t per (segment, side of the token);
    * ``sq_N``: ||v_t||^2.
    """
  init = {}
  if mu_SZD is not None:
    init['proj_NZ'] = jnp.zeros((num_tokens, 2), jnp.float32)
  if weight_N is not None:
    init['sums_SZD'] = jnp.zeros((num_seg, 2, dim), jnp.float32)
  if want_sq:
    init['sq_N'] = jnp.zeros((num_tokens,), jnp.float32)

  def body(carry, start, fresh_C):
    v_CD = v_fn(start)
    out = dict(carry)
    seg_C = take_chunk(seg_N, start, chunk)
    if mu_SZD is not None:
      if num_seg == 1:
        proj_CZ = jnp.einsum('CD,ZD->CZ', v_CD, mu_SZD[0])
      else:
        proj_CZ = jnp.einsum('CD,CZD->CZ', v_CD, mu_SZD[seg_C])
      out['proj_NZ'] = jax.lax.dynamic_update_slice_in_dim(carry['proj_NZ'], proj_CZ, start, axis=0)
    if weight_N is not None:
      w_C = jnp.where(fresh_C, take_chunk(weight_N, start, chunk), 0.0)
      side_C = take_chunk(side_N, start, chunk)
      if num_seg == 1:
        w_CZ = w_C[:, None] * jax.nn.one_hot(side_C, 2, dtype=jnp.float32)
        add_SZD = jnp.einsum('CZ,CD->ZD', w_CZ, v_CD)[None]
      else:
        add_SZD = jax.ops.segment_sum(w_C[:, None] * v_CD, 2 * seg_C + side_C,
                                      num_segments=2 * num_seg).reshape(num_seg, 2, dim)
      out['sums_SZD'] = carry['sums_SZD'] + add_SZD
    if want_sq:
      out['sq_N'] = jax.lax.dynamic_update_slice_in_dim(carry['sq_N'],
                                                        jnp.sum(v_CD * v_CD,
                                                                axis=-1), start, axis=0)
    return out

  return scan_chunks(num_tokens, chunk, body, init)


# ----------------------------------------------------------------------------------
# Per-token scalar algebra (segments = scope segment x side).
# ----------------------------------------------------------------------------------


def seg_sum(x_N: Array, seg2_N: Array, num_seg: int) -> Array:
  """Sum per (scope segment, side) -> [S, Z]."""
  return jax.ops.segment_sum(x_N, seg2_N, num_segments=2 * num_seg).reshape(num_seg, 2)


def seg_mean_std(x_N: Array, on_N: Array, seg2_N: Array, num_seg: int):
  """Two-pass mean and population std of x over the tokens with on_N, per segment."""
  cnt_SZ = seg_sum(on_N.astype(jnp.float32), seg2_N, num_seg)
  safe_SZ = jnp.maximum(cnt_SZ, 1.0)
  mean_SZ = seg_sum(jnp.where(on_N, x_N, 0.0), seg2_N, num_seg) / safe_SZ
  dev_N = jnp.where(on_N, x_N - mean_SZ.reshape(-1)[seg2_N], 0.0)
  var_SZ = seg_sum(dev_N * dev_N, seg2_N, num_seg) / safe_SZ
  return mean_SZ, jnp.sqrt(var_SZ)


def margins(proj_NZ: Array, sq_N: Array, mu_SZD: Array, seg_N: Array, side_N: Array,
            scored_N: Array, *, within_side_only: bool, num_seg: int) -> Array:
  """Own-side margin per token.

    Distances are ``d_Z = ||v||^2 - 2 v.mu_Z + ||mu_Z||^2``. DelTA (eq:DelTA-alpha)
    uses ``m = d_opp - d_own``; the ``||v||^2`` terms cancel, so it is computed as
    ``2 (v.mu_own - v.mu_opp) + ||mu_opp||^2 - ||mu_own||^2`` (no cancellation error).
    Within-side only (Table 4): ``m = mean_side(d_own) - d_own`` (own-side centrality:
    positive for tokens closer than average to their own centroid).
    """
  musq_SZ = jnp.sum(mu_SZD * mu_SZD, axis=-1)
  musq_NZ = musq_SZ[seg_N]
  own_N = side_N
  opp_N = 1 - side_N
  take = lambda x_NZ, z_N: jnp.take_along_axis(x_NZ, z_N[:, None], axis=1)[:, 0]
  if not within_side_only:
    return (2.0 * (take(proj_NZ, own_N) - take(proj_NZ, opp_N)) + take(musq_NZ, opp_N) -
            take(musq_NZ, own_N))
  d_own_N = sq_N - 2.0 * take(proj_NZ, own_N) + take(musq_NZ, own_N)
  seg2_N = 2 * seg_N + side_N
  mean_SZ, _ = seg_mean_std(d_own_N, scored_N, seg2_N, num_seg)
  return mean_SZ.reshape(-1)[seg2_N] - d_own_N


def assign(margin_N: Array, scored_N: Array, seg2_N: Array, *, num_seg: int, gamma: Optional[float],
           unit_S: Optional[Array], soft_assignment: bool):
  """alpha = sigmoid(m / gamma_side) (eq:DelTA-alpha) or hard 1[m > 0] (w/o h(alpha)).

    Adaptive gamma (gamma=None): the spread of the margins, i.e. the population std of
    m over the scored tokens of the same side and scope segment (floored at 1e-12).
    Fixed gamma: gamma * unit_S, the same for both sides (unit_S: E||v||^2 per segment).
    Returns (alpha_N, gamma_SZ).
    """
  if gamma is None:
    _, std_SZ = seg_mean_std(margin_N, scored_N, seg2_N, num_seg)
    gamma_SZ = jnp.maximum(std_SZ, GAMMA_FLOOR)
  else:
    gamma_SZ = jnp.broadcast_to(jnp.maximum(gamma * unit_S, GAMMA_FLOOR)[:, None], (num_seg, 2))
  if soft_assignment:
    alpha_N = jax.nn.sigmoid(margin_N / gamma_SZ.reshape(-1)[seg2_N])
  else:
    alpha_N = (margin_N > 0).astype(jnp.float32)
  return alpha_N, gamma_SZ


def select(score_N: Array, valid_N: Array, seg_N: Array, *, num_seg: int,
           descending: bool) -> Array:
  """Hard mask keeping ceil(n/2) of the n valid tokens of every segment by score
    (Figure 3). Segments are any labels in [0, num_seg); ties broken by token index.
    """
  num_tokens = score_N.shape[0]
  key_N = -score_N if descending else score_N
  order_N = jnp.lexsort((key_N, ~valid_N, seg_N))
  pos_N = jnp.zeros((num_tokens,),
                    jnp.int32).at[order_N].set(jnp.arange(num_tokens, dtype=jnp.int32))
  size_S = jax.ops.segment_sum(jnp.ones_like(seg_N), seg_N, num_segments=num_seg)
  start_S = jnp.cumsum(size_S) - size_S
  rank_N = pos_N - start_S[seg_N]
  n_valid_S = jax.ops.segment_sum(valid_N.astype(jnp.int32), seg_N, num_segments=num_seg)
  n_keep_S = (n_valid_S + 1) // 2
  return valid_N & (rank_N < n_keep_S[seg_N])
