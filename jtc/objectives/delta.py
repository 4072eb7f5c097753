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

refines the centroids num_refine times as alpha-weighted within-side averages, maps the final
scores to ``lam = lam_min + (lam_max - lam_min) * alpha*`` and self-normalises them
(eq:DelTA-weighted-objective), ``lam_bar = lam * n / sum(lam)`` (n valid tokens), so a DAPO token-mean
with the weights ``lam_bar`` is the paper's self-normalised objective. This is the ONLY
place lambda is normalised: `surrogates.delta` uses the coefficients as given, so the
"w/o lambda-norm" ablation trains on sum(lam * ppo) / n.

The token-gradient proxy is the LM-head output-row gradient (Implementation):
``grad_{W_y} log p(y) = (1 - p(y)) h``, with ``h`` the final-normed hidden state that
predicted the token. It is computed chunk by chunk from the hidden states of the
behaviour log-prob forward pass (`jtc.objectives.delta_geometry`), so no extra model forward pass is
needed (the paper's implementation spends num_refine + 2 = 3 of them) and only one chunk of ``v`` is
ever materialised. That holds the step's [B, T, D] hidden states from the behaviour pass to this
one; ``delta.hidden = 'recomputed'`` trades them for 2K + 2 forward passes of a chunk of rows
at a time (`jtc.objectives.delta_recompute`). The trainer's plug-in and the token clouds are in
`jtc.objectives.token_weights`.

Dimension key (docs/dimensions.md):
  B: batch (trajectories)    T: completion length     D: model dim
  V: vocabulary              U: flattened tokens B*T  C: tokens per chunk
  I: scope segments (1 for scope='batch', B // G for scope='group')
  G: group size              W: top-k candidates (topk_hidden proxy only)
  Z: side (0 = positive advantage, 1 = negative advantage)
"""

from __future__ import annotations

import functools
from typing import Optional

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jtc.objectives import delta_geometry as geometry
from jtc.objectives import delta_recompute
# The options and the named ablations are part of this module's API (`delta.DELTA_ABLATIONS`).
from jtc.objectives.delta_options import DELTA_ABLATIONS, DeltaOptions, ablation_options, options_for  # pylint: disable=unused-import

Array = jax.Array

POS, NEG = geometry.POS, geometry.NEG


def _validate(hidden_BTD, token_logps_BT, advantages_B, mask_BT, options, *, group_size, rng,
              unembed_VD, token_ids_BT):
  """The inputs' ranks, shapes and dtypes, and what the options need (a ValueError)."""
  if isinstance(hidden_BTD, delta_recompute.RecomputedHidden):  # its shape, float32 when computed
    hidden_BTD = jax.ShapeDtypeStruct(hidden_BTD.shape, jnp.float32)
  chex.assert_rank([hidden_BTD, token_logps_BT, advantages_B, mask_BT], [3, 2, 1, 2])
  chex.assert_equal_shape([token_logps_BT, mask_BT])
  chex.assert_equal_shape_prefix([hidden_BTD, token_logps_BT], 2)
  chex.assert_equal_shape_prefix([hidden_BTD, advantages_B], 1)
  chex.assert_type([hidden_BTD, token_logps_BT, advantages_B], [float, float, float])
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


def token_coefficients(hidden_BTD: Array, token_logps_BT: Array, advantages_B: Array,
                       mask_BT: Array, options: DeltaOptions = DeltaOptions(), *,
                       group_size: Optional[int] = None, rng: Optional[Array] = None,
                       unembed_VD: Optional[Array] = None, token_ids_BT: Optional[Array] = None,
                       row_sharding=None) -> tuple[Array, dict[str, Array]]:
  """DelTA token coefficients ``lam_BT`` (constants) and scalar diagnostics.

    Algorithm (DelTA Method / Implementation; eq labels from the paper):
      v_{i,t} = (1 - p_t(y_t)) h_t                                  (LM-head proxy)
      mu_Z^(0) = sum_{side Z} |A_i| v_{i,t} / sum_{side Z} |A_i|    (eq:centroid-decomposition)
      for k = 0..num_refine:  m^(k) = ||v - mu_opp^(k)||^2 - ||v - mu_own^(k)||^2
                     alpha^(k) = sigmoid(m^(k) / gamma_side^(k))      (eq:DelTA-alpha)
                     if k < num_refine: mu_Z^(k+1) = sum |A| alpha^(k) v / sum |A| alpha^(k)
      lam = lam_min + (lam_max - lam_min) alpha^(num_refine)          (range map)
      lam_bar = lam * n / sum(lam)   over the n valid tokens of a scope segment
                                                           (eq:DelTA-weighted-objective)

    Token classes: *masked* tokens (mask 0) get lam = 0 and never touch a centroid or
    statistic. *Scored* tokens are valid, have A != 0 and their scope segment has both
    a positive and a negative side. Other valid tokens (A == 0, or the opposite side
    is empty: 'frac_one_sided') get the neutral lam = 1 before normalisation.

    Passes over the hidden states: 2K + 2 chunked passes, each materialising one [B, C, D]
    block of v, C tokens of every row (adaptive gamma needs all margins before any alpha is
    known). Sharded: rows split over devices stay on them. Centroids and gammas are sums over
    segments (per row, then over the rows of a segment: one small reduction across the
    devices), every per-token quantity is elementwise on the rows' own devices, and no device
    gathers another's hidden states (only the hard selections of Figure 3 sort all tokens).

    Args:
      hidden_BTD: [B, T, D] final-normed hidden states that predicted each completion
        token (any float dtype; math in float32), or a `delta_recompute.RecomputedHidden`
        that recomputes them a chunk of rows at a time in each of the 2K + 2 passes (no [B, T,
        D] array exists; the same coefficients up to float32 round-off).
      token_logps_BT: [B, T] log p(y_t), the log-prob of the sampled token.
      advantages_B: [B] sequence advantages A_i (only sign and |A| are used).
      mask_BT: [B, T] valid completion tokens (bool or 0/1).
      options: `DeltaOptions` (static).
      group_size: G, trajectories per prompt (consecutive rows); needed for scope 'group'.
      rng: PRNG key, needed by random_lambda and the random selections.
      unembed_VD [V, D], token_ids_BT [B, T]: for proxy='topk_hidden' only.
      row_sharding: None, or a hashable function from [B, ...] values to their shardings
        (`jtc.rl.sharding.RowSharding`) that the pass's per-row values are constrained to.

    Returns:
      lam_BT: [B, T] float32, stop-gradient constants.
      metrics: dict of float32 scalars: per-side ('pos'/'neg') mean/std/min/max of the
        range-mapped lam before normalisation and of the final margins, gamma per side,
        'frac_one_sided', 'frac_scored', 'norm_factor', 'centroid_cos' (mean cosine of
        final mu+ and mu- over two-sided segments), 'frac_selected' and
        'selected_pos_share' (the share of kept tokens with A > 0).
    """
  _validate(hidden_BTD, token_logps_BT, advantages_B, mask_BT, options, group_size=group_size,
            rng=rng, unembed_VD=unembed_VD, token_ids_BT=token_ids_BT)
  o = options
  tk = _token_classes(advantages_B, mask_BT, scope=o.scope, group_size=group_size)
  if o.random_lambda:  # the ablation: uniform scores, no geometry
    alpha_U = jax.random.uniform(jax.random.fold_in(rng, 0), tk.valid_U.shape)
    margin_U, gamma_IZ = jnp.zeros_like(alpha_U), jnp.zeros((tk.num_seg, 2), jnp.float32)
    centroid_cos = jnp.float32(0.0)
  else:
    run = _proxy_pass(hidden_BTD, token_logps_BT, tk, o, unembed_VD=unembed_VD,
                      token_ids_BT=token_ids_BT, row_sharding=row_sharding)
    alpha_U, margin_U, gamma_IZ, centroid_cos = _scores(run, tk, o)
  # Range map; valid tokens DelTA does not score get the neutral 1, masked ones 0.
  lam_mapped_U = o.lam_min + (o.lam_max - o.lam_min) * alpha_U if o.range_map else alpha_U
  lam_U = jnp.where(tk.valid_U, jnp.where(tk.scored_U, lam_mapped_U, 1.0), 0.0)
  metrics = {}
  final_U = lam_U
  if o.selection is not None:
    final_U, metrics = _select(lam_U, tk, o.selection, rng)
  if o.normalize:
    final_U, metrics['norm_factor'] = _normalise(final_U, tk)
  # lam is a constant per-token weight of the surrogate (eq:DelTA-weighted-objective
  # uses stop-gradient coefficients): no gradient may flow through the proxy.
  final_U = jax.lax.stop_gradient(final_U)
  metrics.update(_diagnostics(tk, lam_U, margin_U, gamma_IZ, centroid_cos))
  metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
  return final_U.reshape(mask_BT.shape), metrics


@flax.struct.dataclass
class _Tokens:
  """Per-token bookkeeping of one batch, flattened to U = B * T (all [U] unless stated).

  valid: real tokens; adv: their trajectory's advantage; seg: scope segment; side: POS / NEG;
  seg2 = 2 seg + side; on_side: valid with A != 0; mass_IZ: |A| mass per segment side;
  two_sided_I: both sides present; scored: on_side in a two-sided segment; weight: |A|
  where scored, else 0; seg2_B / seg_B: each row's (its tokens share them); num_seg: I
  (static)."""
  valid_U: Array
  adv_U: Array
  seg_U: Array
  side_U: Array
  seg2_U: Array
  on_side_U: Array
  mass_IZ: Array
  two_sided_I: Array
  scored_U: Array
  weight_U: Array
  seg_B: Array
  seg2_B: Array
  num_seg: int = flax.struct.field(pytree_node=False)

  def rows(self, x_U):
    """A [U] vector as [B, T]."""
    return x_U.reshape(self.seg_B.shape[0], -1)


def _token_classes(advantages_B, mask_BT, *, scope, group_size):
  """The `_Tokens` of a batch: which tokens DelTA scores and their |A| weights."""
  batch, length = mask_BT.shape
  num_seg = batch // group_size if scope == 'group' else 1
  valid_U = (mask_BT > 0).reshape(-1)
  adv_U = jnp.repeat(advantages_B.astype(jnp.float32), length)
  seg_B = (jnp.arange(batch) // (batch // num_seg)).astype(jnp.int32)
  seg2_B = 2 * seg_B + jnp.where(advantages_B < 0, NEG, POS).astype(jnp.int32)
  seg_U = jnp.repeat(seg_B, length)
  side_U = jnp.where(adv_U < 0, NEG, POS).astype(jnp.int32)
  seg2_U = 2 * seg_U + side_U
  on_side_U = valid_U & (adv_U != 0)
  mass_IZ = geometry.seg_sum(jnp.where(on_side_U, jnp.abs(adv_U), 0.0), seg2_U, num_seg)
  two_sided_I = jnp.all(mass_IZ > 0, axis=-1)
  scored_U = on_side_U & two_sided_I[seg_U]
  return _Tokens(valid_U=valid_U, adv_U=adv_U, seg_U=seg_U, side_U=side_U, seg2_U=seg2_U,
                 on_side_U=on_side_U, mass_IZ=mass_IZ, two_sided_I=two_sided_I, scored_U=scored_U,
                 weight_U=jnp.where(scored_U, jnp.abs(adv_U),
                                    0.0), seg_B=seg_B, seg2_B=seg2_B, num_seg=num_seg)


def _proxy_pass(hidden, token_logps_BT, tk, o, *, unembed_VD, token_ids_BT, row_sharding):
  """``run(**kwargs)``: one chunked pass over the token-gradient proxies v (the LM-head row
  gradient (1 - p) h, or the top-k hidden proxy), `geometry.proxy_pass`: chunks of C tokens of
  every row, C * rows about ``o.chunk_size``. Held hidden states are read in place; recomputed
  ones (`delta_recompute.RecomputedHidden`) a chunk of rows at a time, each pass recomputing
  them (`delta_recompute.proxy_pass`)."""
  batch, length, dim = hidden.shape
  recomputed = isinstance(hidden, delta_recompute.RecomputedHidden)
  rows = batch // hidden.num_chunks if recomputed else batch
  chunk = min(length, max(1, o.chunk_size // rows))
  constrain = lambda x: (x if row_sharding is None else jax.lax.with_sharding_constraint(
      x, row_sharding(x)))
  proxies = functools.partial(geometry.chunk_proxies, chunk=chunk, proxy=o.proxy, topk=o.topk,
                              unembed_VD=unembed_VD)
  one_pass = functools.partial(geometry.proxy_pass, length=length, chunk=chunk, num_seg=tk.num_seg,
                               dim=dim, constrain=constrain)
  if not recomputed:
    v_fn = proxies(hidden, token_logps_BT, token_ids_BT=token_ids_BT)
    return functools.partial(one_pass, v_fn, tk.seg2_B)

  def run(mu_BZD=None, weight_BT=None, want_sq=False):
    per_row = dict(seg2_B=tk.seg2_B, logps_BT=token_logps_BT, ids_BT=token_ids_BT, mu_BZD=mu_BZD,
                   weight_BT=weight_BT)
    chunk_pass = lambda hidden_BTD, x: one_pass(
        proxies(hidden_BTD, x['logps_BT'], token_ids_BT=x['ids_BT']), x['seg2_B'], mu_BZD=x[
            'mu_BZD'], weight_BT=x['weight_BT'], want_sq=want_sq)
    return delta_recompute.proxy_pass(hidden, chunk_pass, per_row, num_seg=tk.num_seg,
                                      constrain=constrain)

  return run


def _scores(run, tk, o):
  """alpha* by num_refine refinements of the |A|-weighted side centroids: mu_Z^(0) from the scored
  tokens (eq:centroid-decomposition), then per iteration the margins, alpha^(k) = sigmoid(m /
  gamma_side) (eq:DelTA-alpha) and the alpha-weighted centroids. Returns (alpha_U, margin_U,
  gamma_IZ, centroid_cos: mean cosine of the final mu+ and mu- over two-sided segments)."""
  num_seg = tk.num_seg
  first = run(weight_BT=tk.rows(tk.weight_U), want_sq=o.within_side_only or o.gamma is not None)
  sq_U = first.get('sq_U')
  unit_I = None
  if o.gamma is not None:  # a fixed gamma is stated in units of the mean ||v||^2
    n_scored_I = jax.ops.segment_sum(tk.scored_U.astype(jnp.float32), tk.seg_U,
                                     num_segments=num_seg)
    unit_I = (
        jax.ops.segment_sum(jnp.where(tk.scored_U, sq_U, 0.0), tk.seg_U, num_segments=num_seg) /
        jnp.maximum(n_scored_I, 1.0))
  mu_IZD = first['sums_IZD'] / jnp.maximum(tk.mass_IZ, 1e-30)[..., None]
  for k in range(o.num_refine + 1):
    proj_UZ = run(mu_BZD=mu_IZD[tk.seg_B])['proj_UZ']
    margin_U = geometry.margins(proj_UZ, sq_U, mu_IZD, tk.seg_U, tk.side_U, tk.scored_U,
                                within_side_only=o.within_side_only, num_seg=num_seg)
    alpha_U, gamma_IZ = geometry.assign(margin_U, tk.scored_U, tk.seg2_U, num_seg=num_seg,
                                        gamma=o.gamma, unit_I=unit_I,
                                        soft_assignment=o.soft_assignment)
    if k < o.num_refine:
      w_alpha_U = tk.weight_U * alpha_U
      den_IZ = geometry.seg_sum(w_alpha_U, tk.seg2_U, num_seg)
      sums_IZD = run(weight_BT=tk.rows(w_alpha_U))['sums_IZD']
      # A side whose scores are all zero (possible with hard assignment) keeps its centroid.
      mu_IZD = jnp.where((den_IZ > 0)[..., None], sums_IZD / jnp.maximum(den_IZ, 1e-30)[..., None],
                         mu_IZD)
  dot_I = jnp.sum(mu_IZD[:, POS] * mu_IZD[:, NEG], axis=-1)
  nrm_I = jnp.linalg.norm(mu_IZD[:, POS], axis=-1) * jnp.linalg.norm(mu_IZD[:, NEG], axis=-1)
  cos_I = dot_I / jnp.maximum(nrm_I, 1e-30)
  centroid_cos = (jnp.sum(jnp.where(tk.two_sided_I, cos_I, 0.0)) /
                  jnp.maximum(jnp.sum(tk.two_sided_I), 1))
  return alpha_U, margin_U, gamma_IZ, centroid_cos


def _select(lam_U, tk, selection, rng):
  """Figure 3's hard selection: keep half of each advantage side's tokens (or of the pooled
  segment, '*_pooled') by lam ('top' / 'bottom') or at random; (keep as 0/1 weights, metrics)."""
  rule, _, pooled = selection.partition('_')
  if rule == 'random':
    score_U = jax.random.uniform(jax.random.fold_in(rng, 1), lam_U.shape)
  else:
    score_U = lam_U
  if pooled:
    keep_U = geometry.select(score_U, tk.valid_U, tk.seg_U, num_seg=tk.num_seg, descending=rule
                             != 'bottom')
  else:
    keep_U = geometry.select(score_U, tk.on_side_U, tk.seg2_U, num_seg=2 * tk.num_seg,
                             descending=rule != 'bottom')
  metrics = {
      'frac_selected': jnp.sum(keep_U) / jnp.maximum(jnp.sum(tk.valid_U), 1),
      'selected_pos_share': jnp.sum(keep_U & (tk.adv_U > 0)) / jnp.maximum(jnp.sum(keep_U), 1)
  }
  return keep_U.astype(jnp.float32), metrics


def _normalise(x_U, tk):
  """Self-normalisation lam_bar = lam * n / sum(lam) over the valid tokens of each scope
  segment (eq:DelTA-weighted-objective); (lam_bar, the mean factor)."""
  n_I = jax.ops.segment_sum(tk.valid_U.astype(jnp.float32), tk.seg_U, num_segments=tk.num_seg)
  z_I = jax.ops.segment_sum(x_U, tk.seg_U, num_segments=tk.num_seg)
  factor_I = jnp.where(z_I > 0, n_I / jnp.maximum(z_I, 1e-30), 1.0)
  return x_U * factor_I[tk.seg_U], jnp.mean(factor_I)


def _diagnostics(tk, lam_U, margin_U, gamma_IZ, centroid_cos):
  """The scalar metrics of `token_coefficients` (per side: lam before normalisation, the
  final margins, gamma; the shares of one-sided and scored tokens; the centroid cosine)."""
  n_side = jnp.maximum(jnp.sum(tk.on_side_U), 1)
  metrics = {
      'frac_one_sided': jnp.sum(tk.on_side_U & ~tk.scored_U) / n_side,
      'frac_scored': jnp.sum(tk.scored_U) / jnp.maximum(jnp.sum(tk.valid_U), 1),
      'centroid_cos': centroid_cos
  }
  for name, z in (('pos', POS), ('neg', NEG)):
    on_U = tk.scored_U & (tk.side_U == z)
    metrics.update(_masked_stats(f'lam_{name}', lam_U, on_U))
    metrics.update(_masked_stats(f'margin_{name}', margin_U, on_U))
    metrics[f'gamma_{name}'] = (jnp.sum(jnp.where(tk.two_sided_I, gamma_IZ[:, z], 0.0)) /
                                jnp.maximum(jnp.sum(tk.two_sided_I), 1))
  return metrics


def _masked_stats(prefix: str, x_U: Array, on_U: Array) -> dict[str, Array]:
  """mean/std/min/max of x over on_U (all 0 when on_U is empty)."""
  cnt = jnp.maximum(jnp.sum(on_U), 1)
  mean = jnp.sum(jnp.where(on_U, x_U, 0.0)) / cnt
  var = jnp.sum(jnp.where(on_U, (x_U - mean)**2, 0.0)) / cnt
  any_on = jnp.any(on_U)
  return {
      f'{prefix}_mean': mean,
      f'{prefix}_std': jnp.sqrt(var),
      f'{prefix}_min': jnp.where(any_on, jnp.min(jnp.where(on_U, x_U, jnp.inf)), 0.0),
      f'{prefix}_max': jnp.where(any_on, jnp.max(jnp.where(on_U, x_U, -jnp.inf)), 0.0),
  }
