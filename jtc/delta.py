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
place lambda is normalised: `surrogates.delta` uses the coefficients as given, so the
"w/o lambda-norm" ablation trains on sum(lam * ppo) / N.

The token-gradient proxy is the LM-head output-row gradient (Implementation):
``grad_{W_y} log p(y) = (1 - p(y)) h``, with ``h`` the final-normed hidden state that
predicted the token. It is computed chunk by chunk from the hidden states of the
behaviour log-prob forward pass (`jtc.delta_geometry`), so no extra model forward pass is
needed (the paper's implementation spends K + 2 = 3 of them) and only one chunk of ``v`` is
ever materialised. The trainer's plug-in and the token clouds are in `jtc.token_weights`.

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
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp

from jtc import delta_geometry as geometry

Array = jax.Array

POS, NEG = geometry.POS, geometry.NEG
_SCOPES = ('batch', 'group')
_PROXIES = ('lm_head', 'topk_hidden')
_SELECTIONS = (None, 'top', 'bottom', 'random', 'top_pooled', 'bottom_pooled', 'random_pooled')

# Named configurations reproducing DelTA Table 4 (component, within-side and proxy
# ablations) and Figure 3 (hard token selection). Each value is a dict of keyword
# options for `token_coefficients`; pick one with `ablation_options(name)`.
DELTA_ABLATIONS: dict[str, dict[str, Any]] = {
    # Full DelTA: adaptive gamma, soft assignment, K = 1, range map, normalisation.
    'full': {},
    # Table 4 "w/o adaptive gamma": one fixed temperature for both sides and every
    # refinement step. The digest does not state the paper's value. Margins are
    # differences of squared distances, so gamma is stated in units of the mean squared
    # proxy norm E||v||^2 of the scored tokens (the scale margins are measured in): the
    # ablation means the same on any model, whatever its hidden-state norms. 1.0 is our
    # choice; the trainer logs the resulting gamma next to the adaptive one.
    'no_adaptive_gamma': {
        'gamma': 1.0
    },
    # Table 4 "w/o h(alpha)": no entropy regulariser in the assignment objective, so
    # its maximiser is the hard assignment alpha = 1[margin > 0].
    'no_soft_assignment': {
        'soft_assignment': False
    },
    # Table 4 "w/o lambda-norm": keep lam in [lam_min, lam_max], no N / sum(lam).
    'no_normalization': {
        'normalize': False
    },
    # Table 4 "w/o range map": raw scores alpha* in [0, 1] instead of the affine map.
    'no_range_map': {
        'range_map': False
    },
    # Table 4 "w/o refinement": K = 0, score against the initial |A|-weighted centroids.
    'no_refinement': {
        'num_refine': 0
    },
    # Table 4 "within-side only": own-side centrality, no opposite-side comparison.
    'within_side_only': {
        'within_side_only': True
    },
    # Table 4 "random lambda": i.i.d. uniform alpha, same range map and normalisation.
    'random_lambda': {
        'random_lambda': True
    },
    # Table 4 "top-K hidden-gradient proxy" (see `topk_hidden_proxy`).
    'topk_proxy': {
        'proxy': 'topk_hidden'
    },
    # Figure 3: hard masks keeping the top-lambda, bottom-lambda or a random half of
    # the tokens of EACH advantage side (the same share kept on both sides), so the
    # comparison is about which tokens, not about positive- vs negative-only training.
    'select_top': {
        'selection': 'top'
    },
    'select_bottom': {
        'selection': 'bottom'
    },
    'select_random': {
        'selection': 'random'
    },
    # The same masks ranked over all valid tokens of the batch pooled (the rule of the
    # first jtc runs): lam differs mostly by side, so top keeps mostly positive-side and
    # bottom mostly negative-side (and zero-advantage) tokens.
    'select_top_pooled': {
        'selection': 'top_pooled'
    },
    'select_bottom_pooled': {
        'selection': 'bottom_pooled'
    },
    'select_random_pooled': {
        'selection': 'random_pooled'
    },
}


def ablation_options(name: str) -> dict[str, Any]:
  """Options dict of the named DelTA ablation (a copy); unknown name -> ValueError."""
  if name not in DELTA_ABLATIONS:
    raise ValueError(f'Unknown DelTA ablation {name!r}; valid: {sorted(DELTA_ABLATIONS)}')
  return dict(DELTA_ABLATIONS[name])


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
      then sum(lam * ppo) / N (`surrogates.delta` does not renormalise).
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
  scope: str = 'batch'
  soft_assignment: bool = True
  normalize: bool = True
  range_map: bool = True
  within_side_only: bool = False
  random_lambda: bool = False
  proxy: str = 'lm_head'
  topk: int = 16
  selection: Optional[str] = None
  chunk_size: int = 4096

  def __post_init__(self):
    if self.scope not in _SCOPES:
      raise ValueError(f'Unknown scope {self.scope!r}; valid: {list(_SCOPES)}')
    if self.proxy not in _PROXIES:
      raise ValueError(f'Unknown proxy {self.proxy!r}; valid: {list(_PROXIES)}')
    if self.selection not in _SELECTIONS:
      raise ValueError(f'Unknown selection {self.selection!r}; valid: {list(_SELECTIONS)}')
    if not self.lam_min <= self.lam_max:
      raise ValueError(f'Need lam_min <= lam_max, got lam_min={self.lam_min}, '
                       f'lam_max={self.lam_max}')
    if not (isinstance(self.num_refine, int) and self.num_refine >= 0):
      raise ValueError(f'num_refine must be an int >= 0, got {self.num_refine!r}')
    if self.gamma is not None and not self.gamma > 0:
      raise ValueError(f'gamma must be None (adaptive) or > 0, got {self.gamma!r}')
    if not (isinstance(self.chunk_size, int) and self.chunk_size >= 1):
      raise ValueError(f'chunk_size must be an int >= 1, got {self.chunk_size!r}')
    if not (isinstance(self.topk, int) and self.topk >= 1):
      raise ValueError(f'topk must be an int >= 1, got {self.topk!r}')

  @property
  def uses_rng(self) -> bool:
    return self.random_lambda or self.selection in ('random', 'random_pooled')


def options_for(ablation: str, **settings: Any) -> DeltaOptions:
  """`DeltaOptions` of the named ablation on top of ``settings`` (the ablation wins)."""
  return DeltaOptions(**{**settings, **ablation_options(ablation)})


def _validate(hidden_BTD, options, *, group_size, rng, unembed_VD, token_ids_BT):
  batch = hidden_BTD.shape[0]
  if options.scope == 'group':
    if group_size is None or group_size < 1 or batch % group_size:
      raise ValueError(f"scope='group' needs a group_size dividing the batch {batch}, "
                       f'got group_size={group_size!r}')
  if options.uses_rng and rng is None:
    raise ValueError('random_lambda=True and the random selections need rng (a PRNG key)')
  if options.proxy == 'topk_hidden':
    if unembed_VD is None or token_ids_BT is None:
      raise ValueError("proxy='topk_hidden' needs unembed_VD and token_ids_BT")
    if not options.topk <= unembed_VD.shape[0]:
      raise ValueError(f'topk must be in [1, V={unembed_VD.shape[0]}], got {options.topk}')


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
  num_seg = batch // group_size if scope == 'group' else 1

  # ---- per-token bookkeeping (all [N] scalars) ----
  valid_N = (mask_BT > 0).reshape(-1)
  adv_N = jnp.repeat(advantages_B.astype(jnp.float32), length)
  seg_N = jnp.repeat(jnp.arange(batch) // (batch // num_seg), length).astype(jnp.int32)
  side_N = jnp.where(adv_N < 0, NEG, POS).astype(jnp.int32)
  seg2_N = 2 * seg_N + side_N
  on_side_N = valid_N & (adv_N != 0)
  mass_SZ = geometry.seg_sum(jnp.where(on_side_N, jnp.abs(adv_N), 0.0), seg2_N, num_seg)
  two_sided_S = jnp.all(mass_SZ > 0, axis=-1)
  scored_N = on_side_N & two_sided_S[seg_N]
  weight_N = jnp.where(scored_N, jnp.abs(adv_N), 0.0)

  hidden_ND = hidden_BTD.reshape(num_tokens, dim)

  def hidden_chunk(start):
    # Note: XLA:CPU upcasts a bfloat16 loop operand to float32 once, before the loop
    # (a float32 copy of all hidden states); pass float32 hidden states on CPU.
    return jax.lax.dynamic_slice_in_dim(hidden_ND, start, chunk, axis=0)

  if o.proxy == 'lm_head':
    probs_N = token_probs_BT.reshape(-1)
    v_fn = lambda start: geometry.lm_head_proxy(hidden_chunk(start),
                                                geometry.take_chunk(probs_N, start, chunk))
  else:
    ids_N = token_ids_BT.reshape(-1)
    v_fn = lambda start: geometry.topk_hidden_proxy(hidden_chunk(
        start), geometry.take_chunk(ids_N, start, chunk), unembed_VD, topk=o.topk)
  run = functools.partial(geometry.proxy_pass, v_fn, seg_N, side_N, num_tokens=num_tokens,
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
    sq_N = first.get('sq_N')
    unit_S = None
    if gamma is not None:
      n_scored_S = jax.ops.segment_sum(scored_N.astype(jnp.float32), seg_N, num_segments=num_seg)
      unit_S = (jax.ops.segment_sum(jnp.where(scored_N, sq_N, 0.0), seg_N, num_segments=num_seg) /
                jnp.maximum(n_scored_S, 1.0))
    mu_SZD = first['sums_SZD'] / jnp.maximum(mass_SZ, 1e-30)[..., None]
    for k in range(num_refine + 1):
      proj_NZ = run(mu_SZD=mu_SZD)['proj_NZ']
      margin_N = geometry.margins(proj_NZ, sq_N, mu_SZD, seg_N, side_N, scored_N,
                                  within_side_only=within_side_only, num_seg=num_seg)
      alpha_N, gamma_SZ = geometry.assign(margin_N, scored_N, seg2_N, num_seg=num_seg, gamma=gamma,
                                          unit_S=unit_S, soft_assignment=o.soft_assignment)
      if k < num_refine:
        w_alpha_N = weight_N * alpha_N
        den_SZ = geometry.seg_sum(w_alpha_N, seg2_N, num_seg)
        sums_SZD = run(weight_N=w_alpha_N)['sums_SZD']
        # A side whose scores are all zero (possible with hard assignment)
        # keeps its previous centroid.
        mu_SZD = jnp.where((den_SZ > 0)[..., None],
                           sums_SZD / jnp.maximum(den_SZ, 1e-30)[..., None], mu_SZD)
    dot_S = jnp.sum(mu_SZD[:, POS] * mu_SZD[:, NEG], axis=-1)
    nrm_S = jnp.linalg.norm(mu_SZD[:, POS], axis=-1) * jnp.linalg.norm(mu_SZD[:, NEG], axis=-1)
    cos_S = dot_S / jnp.maximum(nrm_S, 1e-30)
    centroid_cos = (jnp.sum(jnp.where(two_sided_S, cos_S, 0.0)) /
                    jnp.maximum(jnp.sum(two_sided_S), 1))

  # ---- coefficients ----
  lam_mapped_N = lam_min + (lam_max - lam_min) * alpha_N if o.range_map else alpha_N
  lam_N = jnp.where(scored_N, lam_mapped_N, 1.0)
  lam_N = jnp.where(valid_N, lam_N, 0.0)

  if selection is not None:
    rule, _, pooled = selection.partition('_')
    if rule == 'random':
      score_N = jax.random.uniform(jax.random.fold_in(rng, 1), (num_tokens,))
    else:
      score_N = lam_N
    if pooled:
      keep_N = geometry.select(score_N, valid_N, seg_N, num_seg=num_seg, descending=rule
                               != 'bottom')
    else:
      keep_N = geometry.select(score_N, on_side_N, seg2_N, num_seg=2 * num_seg, descending=rule
                               != 'bottom')
    final_N = keep_N.astype(jnp.float32)
    metrics['frac_selected'] = jnp.sum(keep_N) / jnp.maximum(jnp.sum(valid_N), 1)
    metrics['selected_pos_share'] = (jnp.sum(keep_N & (adv_N > 0)) /
                                     jnp.maximum(jnp.sum(keep_N), 1))
  else:
    final_N = lam_N

  if o.normalize:
    n_S = jax.ops.segment_sum(valid_N.astype(jnp.float32), seg_N, num_segments=num_seg)
    z_S = jax.ops.segment_sum(final_N, seg_N, num_segments=num_seg)
    factor_S = jnp.where(z_S > 0, n_S / jnp.maximum(z_S, 1e-30), 1.0)
    final_N = final_N * factor_S[seg_N]
    metrics['norm_factor'] = jnp.mean(factor_S)

  # lam is a constant per-token weight of the surrogate (eq:DelTA-weighted-objective
  # uses stop-gradient coefficients): no gradient may flow through the proxy.
  final_N = jax.lax.stop_gradient(final_N)
  lam_BT = final_N.reshape(batch, length)

  # ---- diagnostics ----
  n_side = jnp.maximum(jnp.sum(on_side_N), 1)
  metrics['frac_one_sided'] = jnp.sum(on_side_N & ~scored_N) / n_side
  metrics['frac_scored'] = jnp.sum(scored_N) / jnp.maximum(jnp.sum(valid_N), 1)
  metrics['centroid_cos'] = centroid_cos
  for name, z in (('pos', POS), ('neg', NEG)):
    on_N = scored_N & (side_N == z)
    metrics.update(_masked_stats(f'lam_{name}', lam_N, on_N))
    metrics.update(_masked_stats(f'margin_{name}', margin_N, on_N))
    metrics[f'gamma_{name}'] = (jnp.sum(jnp.where(two_sided_S, gamma_SZ[:, z], 0.0)) /
                                jnp.maximum(jnp.sum(two_sided_S), 1))
  metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
  return lam_BT, metrics


def _masked_stats(prefix: str, x_N: Array, on_N: Array) -> dict[str, Array]:
  """mean/std/min/max of x over on_N (all 0 when on_N is empty)."""
  cnt = jnp.maximum(jnp.sum(on_N), 1)
  mean = jnp.sum(jnp.where(on_N, x_N, 0.0)) / cnt
  var = jnp.sum(jnp.where(on_N, (x_N - mean)**2, 0.0)) / cnt
  any_on = jnp.any(on_N)
  return {
      f'{prefix}_mean': mean,
      f'{prefix}_std': jnp.sqrt(var),
      f'{prefix}_min': jnp.where(any_on, jnp.min(jnp.where(on_N, x_N, jnp.inf)), 0.0),
      f'{prefix}_max': jnp.where(any_on, jnp.max(jnp.where(on_N, x_N, -jnp.inf)), 0.0),
  }
