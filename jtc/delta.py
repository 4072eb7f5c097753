"""DelTA token coefficients: discriminative re-weighting of an RLVR surrogate.

Implements the coefficient estimator of DelTA (arXiv 2605.21467, digest in
``papers/delta_digest_2605.21467.txt``; equation labels below are the paper's).

A group-relative update moves the policy along ``M+ mu+ - M- mu-``
(eq:centroid-decomposition): a contrast between the |A|-weighted centroids of the
positive- and negative-advantage token-gradient vectors ``v_{i,t}``. Tokens shared by
both sides (formatting, boilerplate) pull both centroids towards common background
directions. DelTA scores every token by how much closer it is to its own side's
centroid than to the opposite one (eq:DelTA-alpha),

    alpha_{i,t} = sigmoid( (||v - mu_opp||^2 - ||v - mu_own||^2) / gamma_side ),

refines the centroids K times as alpha-weighted within-side averages, maps the final
scores to ``lam = lam_min + (lam_max - lam_min) * alpha*`` and self-normalises them
(eq:DelTA-weighted-objective), ``lam_bar = lam * N / sum(lam)``, so a DAPO token-mean
with the weights ``lam_bar`` is the paper's self-normalised objective. This is the ONLY
place lambda is normalised: `objectives.delta` uses the coefficients as given, so the
"w/o lambda-norm" ablation trains on sum(lam * ppo) / N.

The token-gradient proxy is the LM-head output-row gradient (Implementation):
``grad_{W_y} log p(y) = (1 - p(y)) h``, with ``h`` the final-normed hidden state that
predicted the token. It is computed chunk by chunk from the hidden states of the
behaviour log-prob forward pass, so no extra model forward pass is needed (the paper's
implementation spends K + 2 = 3 of them) and only one chunk of ``v`` is ever
materialised.

Dimension key:
  B: batch (trajectories)    T: completion length     D: model dim
  V: vocabulary              N: flattened tokens B*T  C: tokens per chunk
  S: scope segments (1 for scope='batch', B // G for scope='group')
  G: group size              K: top-k (topk_hidden proxy only)
  Z: side (0 = positive advantage, 1 = negative advantage)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Optional

import chex
import flax
import jax
import jax.numpy as jnp

Array = jax.Array

POS, NEG = 0, 1
_SCOPES = ("batch", "group")
_PROXIES = ("lm_head", "topk_hidden")
_SELECTIONS = (None, "top", "bottom", "random", "top_pooled", "bottom_pooled",
               "random_pooled")
_GAMMA_FLOOR = 1e-12

# Named configurations reproducing DelTA Table 4 (component, within-side and proxy
# ablations) and Figure 3 (hard token selection). Each value is a dict of keyword
# options for `token_coefficients`; pick one with `ablation_options(name)`.
DELTA_ABLATIONS: dict[str, dict[str, Any]] = {
    # Full DelTA: adaptive gamma, soft assignment, K = 1, range map, normalisation.
    "full": {},
    # Table 4 "w/o adaptive gamma": one fixed temperature for both sides and every
    # refinement step. The digest does not state the paper's value. Margins are
    # differences of squared distances, so gamma is stated in units of the mean squared
    # proxy norm E||v||^2 of the scored tokens (the scale margins are measured in): the
    # ablation means the same on any model, whatever its hidden-state norms. 1.0 is our
    # choice; the trainer logs the resulting gamma next to the adaptive one.
    "no_adaptive_gamma": {"gamma": 1.0},
    # Table 4 "w/o h(alpha)": no entropy regulariser in the assignment objective, so
    # its maximiser is the hard assignment alpha = 1[margin > 0].
    "no_soft_assignment": {"soft_assignment": False},
    # Table 4 "w/o lambda-norm": keep lam in [lam_min, lam_max], no N / sum(lam).
    "no_normalization": {"normalize": False},
    # Table 4 "w/o range map": raw scores alpha* in [0, 1] instead of the affine map.
    "no_range_map": {"range_map": False},
    # Table 4 "w/o refinement": K = 0, score against the initial |A|-weighted centroids.
    "no_refinement": {"num_refine": 0},
    # Table 4 "within-side only": own-side centrality, no opposite-side comparison.
    "within_side_only": {"within_side_only": True},
    # Table 4 "random lambda": i.i.d. uniform alpha, same range map and normalisation.
    "random_lambda": {"random_lambda": True},
    # Table 4 "top-K hidden-gradient proxy" (see `topk_hidden_proxy`).
    "topk_proxy": {"proxy": "topk_hidden"},
    # Figure 3: hard masks keeping the top-lambda, bottom-lambda or a random half of
    # the tokens of EACH advantage side (the same share kept on both sides), so the
    # comparison is about which tokens, not about positive- vs negative-only training.
    "select_top": {"selection": "top"},
    "select_bottom": {"selection": "bottom"},
    "select_random": {"selection": "random"},
    # The same masks ranked over all valid tokens of the batch pooled (the rule of the
    # first jtc runs): lam differs mostly by side, so top keeps mostly positive-side and
    # bottom mostly negative-side (and zero-advantage) tokens.
    "select_top_pooled": {"selection": "top_pooled"},
    "select_bottom_pooled": {"selection": "bottom_pooled"},
    "select_random_pooled": {"selection": "random_pooled"},
}


def ablation_options(name: str) -> dict[str, Any]:
    """Options dict of the named DelTA ablation (a copy); unknown name -> ValueError."""
    if name not in DELTA_ABLATIONS:
        raise ValueError(
            f"Unknown DelTA ablation {name!r}; valid: {sorted(DELTA_ABLATIONS)}")
    return dict(DELTA_ABLATIONS[name])


# ----------------------------------------------------------------------------------
# Token-gradient proxies.
# ----------------------------------------------------------------------------------


def lm_head_proxy(hidden_CD: Array, token_probs_C: Array) -> Array:
    """LM-head output-row gradient ``grad_{W_y} log p(y) = (1 - p(y)) h`` (float32).

    DelTA Implementation paragraph: the layer-restricted proxy of ``v_{i,t}``.
    Args: hidden_CD [..., D] final-normed hidden state; token_probs_C [...] p(y).
    """
    h = hidden_CD.astype(jnp.float32)
    return (1.0 - token_probs_C.astype(jnp.float32))[..., None] * h


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
    logits_CV = jnp.einsum("CD,VD->CV", hidden_CD.astype(jnp.float32), w_VD)
    probs_CV = jax.nn.softmax(logits_CV, axis=-1)
    top_p_CK, top_ids_CK = jax.lax.top_k(probs_CV, topk)
    rows_C1 = jnp.arange(probs_CV.shape[0])[:, None]
    coef_CV = jnp.zeros_like(probs_CV).at[rows_C1, top_ids_CK].set(top_p_CK)
    return w_VD[token_ids_C] - jnp.einsum("CV,VD->CD", coef_CV, w_VD)


# ----------------------------------------------------------------------------------
# Chunked passes over the flattened tokens.
# ----------------------------------------------------------------------------------


def _scan_chunks(num_tokens: int, chunk: int, body: Callable, init: Any) -> Any:
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


def _slice(x_N: Array, start: Array, chunk: int) -> Array:
    return jax.lax.dynamic_slice_in_dim(x_N, start, chunk, axis=0)


def _proxy_pass(v_fn: Callable, seg_N: Array, side_N: Array, *, num_tokens: int,
                chunk: int, num_seg: int, dim: int, mu_SZD: Optional[Array] = None,
                weight_N: Optional[Array] = None, want_sq: bool = False) -> dict:
    """One chunked pass over v = v_fn(start) computing any of:

    * ``proj_NZ``: v . mu_{seg, Z} for both sides of the token's own scope segment;
    * ``sums_SZD``: sum_t weight_t v_t per (segment, side of the token);
    * ``sq_N``: ||v_t||^2.
    """
    init = {}
    if mu_SZD is not None:
        init["proj_NZ"] = jnp.zeros((num_tokens, 2), jnp.float32)
    if weight_N is not None:
        init["sums_SZD"] = jnp.zeros((num_seg, 2, dim), jnp.float32)
    if want_sq:
        init["sq_N"] = jnp.zeros((num_tokens,), jnp.float32)

    def body(carry, start, fresh_C):
        v_CD = v_fn(start)
        out = dict(carry)
        seg_C = _slice(seg_N, start, chunk)
        if mu_SZD is not None:
            if num_seg == 1:
                proj_CZ = jnp.einsum("CD,ZD->CZ", v_CD, mu_SZD[0])
            else:
                proj_CZ = jnp.einsum("CD,CZD->CZ", v_CD, mu_SZD[seg_C])
            out["proj_NZ"] = jax.lax.dynamic_update_slice_in_dim(
                carry["proj_NZ"], proj_CZ, start, axis=0)
        if weight_N is not None:
            w_C = jnp.where(fresh_C, _slice(weight_N, start, chunk), 0.0)
            side_C = _slice(side_N, start, chunk)
            if num_seg == 1:
                w_CZ = w_C[:, None] * jax.nn.one_hot(side_C, 2, dtype=jnp.float32)
                add_SZD = jnp.einsum("CZ,CD->ZD", w_CZ, v_CD)[None]
            else:
                add_SZD = jax.ops.segment_sum(
                    w_C[:, None] * v_CD, 2 * seg_C + side_C,
                    num_segments=2 * num_seg).reshape(num_seg, 2, dim)
            out["sums_SZD"] = carry["sums_SZD"] + add_SZD
        if want_sq:
            out["sq_N"] = jax.lax.dynamic_update_slice_in_dim(
                carry["sq_N"], jnp.sum(v_CD * v_CD, axis=-1), start, axis=0)
        return out

    return _scan_chunks(num_tokens, chunk, body, init)


# ----------------------------------------------------------------------------------
# Per-token scalar algebra (segments = scope segment x side).
# ----------------------------------------------------------------------------------


def _seg_sum(x_N: Array, seg2_N: Array, num_seg: int) -> Array:
    """Sum per (scope segment, side) -> [S, Z]."""
    return jax.ops.segment_sum(x_N, seg2_N, num_segments=2 * num_seg).reshape(num_seg, 2)


def _seg_mean_std(x_N: Array, on_N: Array, seg2_N: Array, num_seg: int):
    """Two-pass mean and population std of x over the tokens with on_N, per segment."""
    cnt_SZ = _seg_sum(on_N.astype(jnp.float32), seg2_N, num_seg)
    safe_SZ = jnp.maximum(cnt_SZ, 1.0)
    mean_SZ = _seg_sum(jnp.where(on_N, x_N, 0.0), seg2_N, num_seg) / safe_SZ
    dev_N = jnp.where(on_N, x_N - mean_SZ.reshape(-1)[seg2_N], 0.0)
    var_SZ = _seg_sum(dev_N * dev_N, seg2_N, num_seg) / safe_SZ
    return mean_SZ, jnp.sqrt(var_SZ)


def _margins(proj_NZ: Array, sq_N: Array, mu_SZD: Array, seg_N: Array, side_N: Array,
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
        return (2.0 * (take(proj_NZ, own_N) - take(proj_NZ, opp_N))
                + take(musq_NZ, opp_N) - take(musq_NZ, own_N))
    d_own_N = sq_N - 2.0 * take(proj_NZ, own_N) + take(musq_NZ, own_N)
    seg2_N = 2 * seg_N + side_N
    mean_SZ, _ = _seg_mean_std(d_own_N, scored_N, seg2_N, num_seg)
    return mean_SZ.reshape(-1)[seg2_N] - d_own_N


def _assign(margin_N: Array, scored_N: Array, seg2_N: Array, *, num_seg: int,
            gamma: Optional[float], unit_S: Optional[Array], soft_assignment: bool):
    """alpha = sigmoid(m / gamma_side) (eq:DelTA-alpha) or hard 1[m > 0] (w/o h(alpha)).

    Adaptive gamma (gamma=None): the spread of the margins, i.e. the population std of
    m over the scored tokens of the same side and scope segment (floored at 1e-12).
    Fixed gamma: gamma * unit_S, the same for both sides (unit_S: E||v||^2 per segment).
    Returns (alpha_N, gamma_SZ).
    """
    if gamma is None:
        _, std_SZ = _seg_mean_std(margin_N, scored_N, seg2_N, num_seg)
        gamma_SZ = jnp.maximum(std_SZ, _GAMMA_FLOOR)
    else:
        gamma_SZ = jnp.broadcast_to(jnp.maximum(gamma * unit_S, _GAMMA_FLOOR)[:, None],
                                    (num_seg, 2))
    if soft_assignment:
        alpha_N = jax.nn.sigmoid(margin_N / gamma_SZ.reshape(-1)[seg2_N])
    else:
        alpha_N = (margin_N > 0).astype(jnp.float32)
    return alpha_N, gamma_SZ


def _select(score_N: Array, valid_N: Array, seg_N: Array, *, num_seg: int,
            descending: bool) -> Array:
    """Hard mask keeping ceil(n/2) of the n valid tokens of every segment by score
    (Figure 3). Segments are any labels in [0, num_seg); ties broken by token index.
    """
    num_tokens = score_N.shape[0]
    key_N = -score_N if descending else score_N
    order_N = jnp.lexsort((key_N, ~valid_N, seg_N))
    pos_N = jnp.zeros((num_tokens,), jnp.int32).at[order_N].set(
        jnp.arange(num_tokens, dtype=jnp.int32))
    size_S = jax.ops.segment_sum(jnp.ones_like(seg_N), seg_N, num_segments=num_seg)
    start_S = jnp.cumsum(size_S) - size_S
    rank_N = pos_N - start_S[seg_N]
    n_valid_S = jax.ops.segment_sum(valid_N.astype(jnp.int32), seg_N, num_segments=num_seg)
    n_keep_S = (n_valid_S + 1) // 2
    return valid_N & (rank_N < n_keep_S[seg_N])


# ----------------------------------------------------------------------------------
# The estimator.
# ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeltaOptions:
    """Every option of the DelTA estimator (hashable: static under jit).

    lam_min, lam_max: range map bounds (paper: [0.8, 1.2]).
    num_refine: K refinement iterations (paper: 1; Table 4 "w/o refinement" = 0).
    gamma: None = adaptive per side (std of the margins); a float = fixed temperature for
      both sides and every refinement step, in units of E||v||^2 (the mean squared proxy
      norm of the scored tokens of the scope segment; Table 4 "w/o adaptive gamma").
    scope: 'batch' (centroids over the rollout batch, as the paper computes once per
      rollout batch) or 'group' (centroids per prompt group). Normalisation and selection
      use the same scope.
    soft_assignment: False = hard alpha = 1[m > 0] (Table 4 "w/o h(alpha)").
    normalize: False = skip lam * N / sum(lam) (Table 4 "w/o lambda-norm"): the loss is
      then sum(lam * ppo) / N (`objectives.delta` does not renormalise).
    range_map: False = raw scores lam = alpha* (Table 4 "w/o range map").
    within_side_only: own-side centrality m = mean(d_own) - d_own instead of the
      opposite-side margin (Table 4 "within-side only").
    random_lambda: alpha ~ U(0, 1) i.i.d. for scored tokens (Table 4 "random lambda").
    proxy: 'lm_head' (paper default) or 'topk_hidden' (Table 4, `topk_hidden_proxy`).
    topk: K of the top-K proxy.
    selection: None, or Figure 3 hard masks 'top' / 'bottom' (the ceil(n/2) tokens of
      highest / lowest lam among the A != 0 tokens of each advantage side of a scope
      segment) / 'random' (a random half of each side); '*_pooled' rank all valid
      tokens of the segment together. lam becomes 1 for kept and 0 for dropped tokens
      (zero-advantage tokens are dropped by the per-side rules: they carry no gradient),
      then normalised.
    chunk_size: tokens per chunk of v.
    """
    lam_min: float = 0.8
    lam_max: float = 1.2
    num_refine: int = 1
    gamma: Optional[float] = None
    scope: str = "batch"
    soft_assignment: bool = True
    normalize: bool = True
    range_map: bool = True
    within_side_only: bool = False
    random_lambda: bool = False
    proxy: str = "lm_head"
    topk: int = 16
    selection: Optional[str] = None
    chunk_size: int = 4096

    def __post_init__(self):
        if self.scope not in _SCOPES:
            raise ValueError(f"Unknown scope {self.scope!r}; valid: {list(_SCOPES)}")
        if self.proxy not in _PROXIES:
            raise ValueError(f"Unknown proxy {self.proxy!r}; valid: {list(_PROXIES)}")
        if self.selection not in _SELECTIONS:
            raise ValueError(
                f"Unknown selection {self.selection!r}; valid: {list(_SELECTIONS)}")
        if not self.lam_min <= self.lam_max:
            raise ValueError(f"Need lam_min <= lam_max, got lam_min={self.lam_min}, "
                             f"lam_max={self.lam_max}")
        if not (isinstance(self.num_refine, int) and self.num_refine >= 0):
            raise ValueError(f"num_refine must be an int >= 0, got {self.num_refine!r}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"gamma must be None (adaptive) or > 0, got {self.gamma!r}")
        if not (isinstance(self.chunk_size, int) and self.chunk_size >= 1):
            raise ValueError(f"chunk_size must be an int >= 1, got {self.chunk_size!r}")
        if not (isinstance(self.topk, int) and self.topk >= 1):
            raise ValueError(f"topk must be an int >= 1, got {self.topk!r}")

    @property
    def uses_rng(self) -> bool:
        return self.random_lambda or self.selection in ("random", "random_pooled")


def options_for(ablation: str, **settings: Any) -> DeltaOptions:
    """`DeltaOptions` of the named ablation on top of ``settings`` (the ablation wins)."""
    return DeltaOptions(**{**settings, **ablation_options(ablation)})


def _validate(hidden_BTD, options, *, group_size, rng, unembed_VD, token_ids_BT):
    batch = hidden_BTD.shape[0]
    if options.scope == "group":
        if group_size is None or group_size < 1 or batch % group_size:
            raise ValueError(
                f"scope='group' needs a group_size dividing the batch {batch}, "
                f"got group_size={group_size!r}")
    if options.uses_rng and rng is None:
        raise ValueError("random_lambda=True and the random selections need rng (a PRNG key)")
    if options.proxy == "topk_hidden":
        if unembed_VD is None or token_ids_BT is None:
            raise ValueError("proxy='topk_hidden' needs unembed_VD and token_ids_BT")
        if not options.topk <= unembed_VD.shape[0]:
            raise ValueError(f"topk must be in [1, V={unembed_VD.shape[0]}], got {options.topk}")


def token_coefficients(
    hidden_BTD: Array,
    token_probs_BT: Array,
    advantages_B: Array,
    mask_BT: Array,
    options: DeltaOptions = DeltaOptions(),
    *,
    group_size: Optional[int] = None,
    rng: Optional[Array] = None,
    unembed_VD: Optional[Array] = None,
    token_ids_BT: Optional[Array] = None,
) -> tuple[Array, dict[str, Array]]:
    """DelTA token coefficients ``lam_BT`` (constants) and scalar diagnostics.

    Algorithm (DelTA Method / Implementation; eq labels from the paper):
      v_{i,t} = (1 - p_t(y_t)) h_t                                  (LM-head proxy)
      mu_Z^(0) = sum_{side Z} |A_i| v_{i,t} / sum_{side Z} |A_i|    (eq:centroid-decomposition)
      for k = 0..K:  m^(k) = ||v - mu_opp^(k)||^2 - ||v - mu_own^(k)||^2
                     alpha^(k) = sigmoid(m^(k) / gamma_side^(k))      (eq:DelTA-alpha)
                     if k < K: mu_Z^(k+1) = sum |A| alpha^(k) v / sum |A| alpha^(k)
      lam = lam_min + (lam_max - lam_min) alpha^(K)                  (range map)
      lam_bar = lam * N / sum(lam)   over the valid tokens of a scope segment
                                                           (eq:DelTA-weighted-objective)

    Token classes: *masked* tokens (mask 0) get lam = 0 and never touch a centroid or
    statistic. *Scored* tokens are valid, have A != 0 and their scope segment has both
    a positive and a negative side. Other valid tokens (A == 0, or the opposite side
    is empty: 'frac_one_sided') get the neutral lam = 1 before normalisation.

    Passes over the hidden states: 2K + 2 chunked passes (sums, then per iteration a
    projection pass and, when k < K, a re-weighted sum pass; adaptive gamma needs all
    margins before any alpha is known). Each pass materialises one [chunk, D] block of v.

    Args:
      hidden_BTD: [B, T, D] final-normed hidden states that predicted each completion
        token (any float dtype; math in float32).
      token_probs_BT: [B, T] p(y_t) = exp(log-prob of the sampled token).
      advantages_B: [B] sequence advantages A_i (only sign and |A| are used).
      mask_BT: [B, T] valid completion tokens (bool or 0/1).
      options: `DeltaOptions` (static).
      group_size: G, trajectories per prompt (consecutive rows); needed for scope 'group'.
      rng: PRNG key, needed by random_lambda and the random selections.
      unembed_VD [V, D], token_ids_BT [B, T]: for proxy='topk_hidden' only.

    Returns:
      lam_BT: [B, T] float32, stop-gradient constants.
      metrics: dict of float32 scalars: per-side ('pos'/'neg') mean/std/min/max of the
        range-mapped lam before normalisation and of the final margins, gamma per side,
        'frac_one_sided', 'frac_scored', 'norm_factor', 'centroid_cos' (mean cosine of
        final mu+ and mu- over two-sided segments), 'frac_selected' and
        'selected_pos_share' (the share of kept tokens with A > 0).
    """
    _validate(hidden_BTD, options, group_size=group_size, rng=rng, unembed_VD=unembed_VD,
              token_ids_BT=token_ids_BT)
    o = options
    lam_min, lam_max, num_refine, gamma, scope = (o.lam_min, o.lam_max, o.num_refine, o.gamma,
                                                  o.scope)
    selection, random_lambda, within_side_only = o.selection, o.random_lambda, o.within_side_only
    chex.assert_rank([hidden_BTD, token_probs_BT, advantages_B, mask_BT], [3, 2, 1, 2])
    chex.assert_equal_shape([token_probs_BT, mask_BT])
    chex.assert_equal_shape_prefix([hidden_BTD, token_probs_BT], 2)
    chex.assert_equal_shape_prefix([hidden_BTD, advantages_B], 1)
    chex.assert_type([hidden_BTD, token_probs_BT, advantages_B], [float, float, float])

    batch, length, dim = hidden_BTD.shape
    num_tokens = batch * length
    chunk = min(o.chunk_size, num_tokens)
    num_seg = batch // group_size if scope == "group" else 1

    # ---- per-token bookkeeping (all [N] scalars) ----
    valid_N = (mask_BT > 0).reshape(-1)
    adv_N = jnp.repeat(advantages_B.astype(jnp.float32), length)
    seg_N = jnp.repeat(jnp.arange(batch) // (batch // num_seg), length).astype(jnp.int32)
    side_N = jnp.where(adv_N < 0, NEG, POS).astype(jnp.int32)
    seg2_N = 2 * seg_N + side_N
    on_side_N = valid_N & (adv_N != 0)
    mass_SZ = _seg_sum(jnp.where(on_side_N, jnp.abs(adv_N), 0.0), seg2_N, num_seg)
    two_sided_S = jnp.all(mass_SZ > 0, axis=-1)
    scored_N = on_side_N & two_sided_S[seg_N]
    weight_N = jnp.where(scored_N, jnp.abs(adv_N), 0.0)

    hidden_ND = hidden_BTD.reshape(num_tokens, dim)

    def hidden_chunk(start):
        # Note: XLA:CPU upcasts a bfloat16 loop operand to float32 once, before the loop
        # (a float32 copy of all hidden states); pass float32 hidden states on CPU.
        return jax.lax.dynamic_slice_in_dim(hidden_ND, start, chunk, axis=0)

    if o.proxy == "lm_head":
        probs_N = token_probs_BT.reshape(-1)
        v_fn = lambda start: lm_head_proxy(hidden_chunk(start), _slice(probs_N, start, chunk))
    else:
        ids_N = token_ids_BT.reshape(-1)
        v_fn = lambda start: topk_hidden_proxy(
            hidden_chunk(start), _slice(ids_N, start, chunk), unembed_VD, topk=o.topk)
    run = functools.partial(_proxy_pass, v_fn, seg_N, side_N, num_tokens=num_tokens,
                            chunk=chunk, num_seg=num_seg, dim=dim)

    # ---- scores alpha* ----
    metrics = {}
    if random_lambda:
        alpha_N = jax.random.uniform(jax.random.fold_in(rng, 0), (num_tokens,))
        margin_N = jnp.zeros((num_tokens,), jnp.float32)
        gamma_SZ = jnp.zeros((num_seg, 2), jnp.float32)
        centroid_cos = jnp.float32(0.0)
    else:
        first = run(weight_N=weight_N, want_sq=within_side_only or gamma is not None)
        sq_N = first.get("sq_N")
        unit_S = None
        if gamma is not None:
            n_scored_S = jax.ops.segment_sum(scored_N.astype(jnp.float32), seg_N,
                                             num_segments=num_seg)
            unit_S = (jax.ops.segment_sum(jnp.where(scored_N, sq_N, 0.0), seg_N,
                                          num_segments=num_seg)
                      / jnp.maximum(n_scored_S, 1.0))
        mu_SZD = first["sums_SZD"] / jnp.maximum(mass_SZ, 1e-30)[..., None]
        for k in range(num_refine + 1):
            proj_NZ = run(mu_SZD=mu_SZD)["proj_NZ"]
            margin_N = _margins(proj_NZ, sq_N, mu_SZD, seg_N, side_N, scored_N,
                                within_side_only=within_side_only, num_seg=num_seg)
            alpha_N, gamma_SZ = _assign(margin_N, scored_N, seg2_N, num_seg=num_seg,
                                        gamma=gamma, unit_S=unit_S,
                                        soft_assignment=o.soft_assignment)
            if k < num_refine:
                w_alpha_N = weight_N * alpha_N
                den_SZ = _seg_sum(w_alpha_N, seg2_N, num_seg)
                sums_SZD = run(weight_N=w_alpha_N)["sums_SZD"]
                # A side whose scores are all zero (possible with hard assignment)
                # keeps its previous centroid.
                mu_SZD = jnp.where((den_SZ > 0)[..., None],
                                   sums_SZD / jnp.maximum(den_SZ, 1e-30)[..., None],
                                   mu_SZD)
        dot_S = jnp.sum(mu_SZD[:, POS] * mu_SZD[:, NEG], axis=-1)
        nrm_S = jnp.linalg.norm(mu_SZD[:, POS], axis=-1) * jnp.linalg.norm(mu_SZD[:, NEG], axis=-1)
        cos_S = dot_S / jnp.maximum(nrm_S, 1e-30)
        centroid_cos = (jnp.sum(jnp.where(two_sided_S, cos_S, 0.0))
                        / jnp.maximum(jnp.sum(two_sided_S), 1))

    # ---- coefficients ----
    lam_mapped_N = lam_min + (lam_max - lam_min) * alpha_N if o.range_map else alpha_N
    lam_N = jnp.where(scored_N, lam_mapped_N, 1.0)
    lam_N = jnp.where(valid_N, lam_N, 0.0)

    if selection is not None:
        rule, _, pooled = selection.partition("_")
        if rule == "random":
            score_N = jax.random.uniform(jax.random.fold_in(rng, 1), (num_tokens,))
        else:
            score_N = lam_N
        if pooled:
            keep_N = _select(score_N, valid_N, seg_N, num_seg=num_seg,
                             descending=rule != "bottom")
        else:
            keep_N = _select(score_N, on_side_N, seg2_N, num_seg=2 * num_seg,
                             descending=rule != "bottom")
        final_N = keep_N.astype(jnp.float32)
        metrics["frac_selected"] = jnp.sum(keep_N) / jnp.maximum(jnp.sum(valid_N), 1)
        metrics["selected_pos_share"] = (jnp.sum(keep_N & (adv_N > 0))
                                         / jnp.maximum(jnp.sum(keep_N), 1))
    else:
        final_N = lam_N

    if o.normalize:
        n_S = jax.ops.segment_sum(valid_N.astype(jnp.float32), seg_N, num_segments=num_seg)
        z_S = jax.ops.segment_sum(final_N, seg_N, num_segments=num_seg)
        factor_S = jnp.where(z_S > 0, n_S / jnp.maximum(z_S, 1e-30), 1.0)
        final_N = final_N * factor_S[seg_N]
        metrics["norm_factor"] = jnp.mean(factor_S)

    # lam is a constant per-token weight of the surrogate (eq:DelTA-weighted-objective
    # uses stop-gradient coefficients): no gradient may flow through the proxy.
    final_N = jax.lax.stop_gradient(final_N)
    lam_BT = final_N.reshape(batch, length)

    # ---- diagnostics ----
    n_side = jnp.maximum(jnp.sum(on_side_N), 1)
    metrics["frac_one_sided"] = jnp.sum(on_side_N & ~scored_N) / n_side
    metrics["frac_scored"] = jnp.sum(scored_N) / jnp.maximum(jnp.sum(valid_N), 1)
    metrics["centroid_cos"] = centroid_cos
    for name, z in (("pos", POS), ("neg", NEG)):
        on_N = scored_N & (side_N == z)
        metrics.update(_masked_stats(f"lam_{name}", lam_N, on_N))
        metrics.update(_masked_stats(f"margin_{name}", margin_N, on_N))
        metrics[f"gamma_{name}"] = (jnp.sum(jnp.where(two_sided_S, gamma_SZ[:, z], 0.0))
                                    / jnp.maximum(jnp.sum(two_sided_S), 1))
    metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
    return lam_BT, metrics


def _masked_stats(prefix: str, x_N: Array, on_N: Array) -> dict[str, Array]:
    """mean/std/min/max of x over on_N (all 0 when on_N is empty)."""
    cnt = jnp.maximum(jnp.sum(on_N), 1)
    mean = jnp.sum(jnp.where(on_N, x_N, 0.0)) / cnt
    var = jnp.sum(jnp.where(on_N, (x_N - mean) ** 2, 0.0)) / cnt
    any_on = jnp.any(on_N)
    return {
        f"{prefix}_mean": mean,
        f"{prefix}_std": jnp.sqrt(var),
        f"{prefix}_min": jnp.where(any_on, jnp.min(jnp.where(on_N, x_N, jnp.inf)), 0.0),
        f"{prefix}_max": jnp.where(any_on, jnp.max(jnp.where(on_N, x_N, -jnp.inf)), 0.0),
    }


# ----------------------------------------------------------------------------------
# Token clouds (DelTA Figure 4): per-vocabulary-id mean lam across steps.
# ----------------------------------------------------------------------------------


@flax.struct.dataclass
class TokenCloudState:
    """Running per-vocabulary-id sums of lam and token counts.

    Attributes: lam_sum_V [V] float32; count_V [V] float32.
    """
    lam_sum_V: Array
    count_V: Array

    @property
    def mean_V(self) -> Array:
        """Mean lam per vocabulary id (0 where never seen)."""
        return self.lam_sum_V / jnp.maximum(self.count_V, 1.0)


def init_token_cloud(vocab_size: int) -> TokenCloudState:
    """Empty accumulator over a vocabulary of ``vocab_size`` ids."""
    return TokenCloudState(lam_sum_V=jnp.zeros((vocab_size,), jnp.float32),
                           count_V=jnp.zeros((vocab_size,), jnp.float32))


def update_token_cloud(state: TokenCloudState, token_ids_BT: Array, lam_BT: Array,
                       mask_BT: Array) -> TokenCloudState:
    """Adds lam of every masked-in token to its vocabulary id (jit-able).

    Pass e.g. ``mask_BT & (advantages_B[:, None] != 0)`` to count scored tokens only.
    """
    chex.assert_rank([token_ids_BT, lam_BT, mask_BT], 2)
    chex.assert_equal_shape([token_ids_BT, lam_BT, mask_BT])
    on_N = (mask_BT > 0).reshape(-1).astype(jnp.float32)
    ids_N = token_ids_BT.reshape(-1)
    lam_N = lam_BT.reshape(-1).astype(jnp.float32)
    return TokenCloudState(
        lam_sum_V=state.lam_sum_V.at[ids_N].add(on_N * lam_N),
        count_V=state.count_V.at[ids_N].add(on_N))


def top_bottom_tokens(state: TokenCloudState, k: int, *, min_count: float = 1.0):
    """The k ids with the highest and the k with the lowest mean lam (Figure 4).

    Ids seen fewer than ``min_count`` times are excluded (if fewer than k are
    eligible, the tail of the result has mean +-inf and should be dropped).

    Returns: dict with 'top_ids', 'top_mean', 'bottom_ids', 'bottom_mean',
      'top_count', 'bottom_count' (each [k]).
    """
    ok_V = state.count_V >= min_count
    mean_V = state.mean_V
    top_mean, top_ids = jax.lax.top_k(jnp.where(ok_V, mean_V, -jnp.inf), k)
    neg_bottom, bottom_ids = jax.lax.top_k(jnp.where(ok_V, -mean_V, -jnp.inf), k)
    return {"top_ids": top_ids, "top_mean": top_mean,
            "top_count": state.count_V[top_ids],
            "bottom_ids": bottom_ids, "bottom_mean": -neg_bottom,
            "bottom_count": state.count_V[bottom_ids]}


# ----------------------------------------------------------------------------------
# The trainer plug-in: token weights from the behaviour pass, and the token cloud.
# ----------------------------------------------------------------------------------


class Weighter:
    """DelTA as a token-weight plug-in of the trainer.

    ``weights(state, params, behaviour, completion_BT, adv_B, mask_BT, rng)`` returns
    (lam_BT, metrics, state): the coefficients `objectives.delta` takes as token_weights,
    computed from the hidden states of the behaviour log-prob pass (``behaviour``: the dict of
    `model.sequence_logprobs` with return_hidden=True, so no extra forward pass), and the
    running token cloud (DelTA Figure 4) over the tokens DelTA scores (real, A != 0). The cloud
    is the plug-in's ``state`` (arrays, checkpointed with the run).
    """

    needs_hidden = True

    def __init__(self, options: DeltaOptions, *, group_size: int, model_config: Any):
        self.options = options
        self.model_config = model_config
        self._coefficients = jax.jit(functools.partial(
            token_coefficients, options=options, group_size=group_size))

    @staticmethod
    def check_config(section: Any) -> DeltaOptions:
        """The `DeltaOptions` of a config's `delta` section (ablation name, range, refinement,
        scope); a ValueError naming the bad key otherwise."""
        if section.ablation not in DELTA_ABLATIONS:
            raise ValueError(f"config.delta.ablation={section.ablation!r} is not valid; valid: "
                             f"{sorted(DELTA_ABLATIONS)}")
        try:
            return options_for(section.ablation, lam_min=section.lam_min,
                               lam_max=section.lam_max, num_refine=section.num_refine,
                               scope=section.scope)
        except ValueError as e:
            raise ValueError(f"config.delta: {e}") from None

    @classmethod
    def from_config(cls, section: Any, *, group_size: int, model_config: Any) -> "Weighter":
        """From a config's `delta` section."""
        return cls(cls.check_config(section), group_size=group_size, model_config=model_config)

    def init_state(self) -> TokenCloudState:
        return init_token_cloud(self.model_config.vocab_size)

    def weights(self, state, params, behaviour, completion_BT, adv_B, mask_BT, rng):
        extra = {}
        if self.options.proxy == "topk_hidden":
            from jtc import model as model_lib  # pylint: disable=import-outside-toplevel
            extra = dict(unembed_VD=model_lib.lm_head_DV(params, self.model_config).T,
                         token_ids_BT=completion_BT)
        lam_BT, metrics = self._coefficients(behaviour["hidden"], jnp.exp(behaviour["logps"]),
                                             adv_B, mask_BT, rng=rng, **extra)
        scored_BT = mask_BT * (adv_B[:, None] != 0)
        state = update_token_cloud(state, completion_BT, lam_BT, scored_BT)
        return lam_BT, metrics, state

    def write(self, state, workdir: str, tokenizer: Any, k: int = 20) -> None:
        """`token_cloud.json`: the tokens with the highest and lowest mean lambda so far."""
        tb = jax.device_get(top_bottom_tokens(state, k, min_count=5))
        rows = {side: [dict(token=tokenizer.decode([int(i)]) or repr(int(i)), id=int(i),
                            mean_lambda=float(m), count=int(n))
                       for i, m, n in zip(tb[f"{side}_ids"], tb[f"{side}_mean"],
                                          tb[f"{side}_count"])]
                for side in ("top", "bottom")}
        with open(os.path.join(workdir, "token_cloud.json"), "w") as f:
            json.dump(rows, f, indent=1)
