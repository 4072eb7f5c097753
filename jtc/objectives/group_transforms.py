"""In-group transforms of trajectory weights (DFPO, paper Sec. 4.4 and Appendix B).

Dimension key (docs/dimensions.md):
  G  group size (completions of one prompt)
  M  number of groups; batched helpers take ``[M, G]`` arrays

Every transform is a pure function of ONE group, ``fn(w_G, adv_G, **kwargs) -> w_tilde_G``, where
``w_G`` are non-negative trajectory weights (in DFPO the post-clip sequence ratios s_bar of
Eq. 47) and ``adv_G`` the group-relative advantages A_hat. The goal (Eq. 63/73) is that the
trajectory-level gradient coefficients w_tilde_i * A_i cancel on tokens the whole group shares:
sum_i w_tilde_i A_i = 0.

  post_clip_weight                  s_bar (Eq. 47): min(s, clip(s)) if A >= 0 else max(s, clip(s))
  min_replace                       w_tilde_i = min_j w_j                                   (Eq. 50)
  orth_proj                         w - (A.w / |A|^2) A                                      (Eq. 18)
  pos_orth_proj_qp                  argmin_v |v - w|^2 / 2  s.t. A.v = 0, v >= 0             (Eq. 51)
  pos_orth_proj_truncate_rebalance  max(w, eps), then rescale one advantage side      (Eq. 52-55)
  global_scale                      w_tilde = c * w   (ablation "scale by c", Table 3)

Degenerate groups (documented per function, all finite, gradients finite too):
  * all A equal / |A| = 0 (a zero-variance group): the projections return ``w`` unchanged
    (every v satisfies A.v = 0); the trajectories carry no signal anyway since A = 0.
  * one advantage side empty but A != 0 (only possible when advantages are not centred): the
    only non-negative orthogonal weights put 0 on the non-empty side, so both Positive
    Orth-Proj solvers return 0 there (and the truncate-and-rebalance bound ``>= eps`` then only
    holds on the A = 0 entries).
  * all weights equal: with sum(A) = 0 they are already orthogonal and every transform returns
    them unchanged (global_scale multiplies by c).
  * a weight of 0: allowed everywhere; Min-Replace then zeroes the whole group.
"""

import chex
import jax
import jax.numpy as jnp


def _check_group(w_G, adv_G):
  chex.assert_rank([w_G, adv_G], 1)
  chex.assert_equal_shape([w_G, adv_G])


def _safe_div(num, den):
  """num / den where den != 0, else 0; safe under jax.grad (no NaN from the unused branch)."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def post_clip_weight(s_G, adv_G, *, eps_low, eps_high):
  """Sign-aware post-clip weight s_bar (paper Eq. 47).

  c_i = clip(s_i, 1 - eps_low, 1 + eps_high);  s_bar_i = min(s_i, c_i) if A_i >= 0 else
  max(s_i, c_i). With it the clipped GSPO objective (1/G) sum_i min(s_i A_i, c_i A_i) (Eq. 48)
  equals (1/G) sum_i A_i s_bar_i exactly (Eq. 49). Works elementwise on any matching shapes.
  """
  chex.assert_equal_shape([s_G, adv_G])
  c_G = jnp.clip(s_G, 1.0 - eps_low, 1.0 + eps_high)
  return jnp.where(adv_G >= 0, jnp.minimum(s_G, c_G), jnp.maximum(s_G, c_G))


def clipped_objective(s_G, adv_G, *, eps_low, eps_high):
  """The per-trajectory clipped terms min(s_i A_i, clip(s_i) A_i) of Eq. 48 (for Eq. 49)."""
  chex.assert_equal_shape([s_G, adv_G])
  c_G = jnp.clip(s_G, 1.0 - eps_low, 1.0 + eps_high)
  return jnp.minimum(s_G * adv_G, c_G * adv_G)


def identity(w_G, adv_G):
  """w_tilde = w (plain GSPO; used for comparisons)."""
  _check_group(w_G, adv_G)
  return w_G


def min_replace(w_G, adv_G):
  """Min-Replace (paper Eq. 17/50): w_tilde_i = min_j w_j for every i.

  With sum_i A_i = 0 the group coefficients sum_i w_tilde_i A_i = w_min sum_i A_i = 0, and
  w_tilde_i A_i = phi_i w_i A_i with phi_i = w_min / w_i in (0, 1] (Theorem C.1: no sign flip).
  """
  _check_group(w_G, adv_G)
  return jnp.broadcast_to(jnp.min(w_G), w_G.shape)


def orth_proj(w_G, adv_G):
  """Orth-Proj (paper Eq. 18): w_tilde = w - (A.w / |A|^2) A, so A.w_tilde = 0.

  The Euclidean projection of w onto the hyperplane A.v = 0; components may become negative
  (see ``pos_orth_proj_qp``). |A| = 0 returns w unchanged.
  """
  _check_group(w_G, adv_G)
  coef = _safe_div(jnp.dot(adv_G, w_G), jnp.dot(adv_G, adv_G))
  return w_G - coef * adv_G


def pos_orth_proj_qp(w_G, adv_G):
  """Positive Orth-Proj, exact solution of the QP of paper Eq. 51.

    v* = argmin_v 1/2 |v - w|^2   s.t.  A.v = 0,  v >= 0.

  KKT: v* = max(w - lam A, 0) for the multiplier lam solving f(lam) = A.max(w - lam A, 0) = 0.
  f is continuous, piecewise linear and non-increasing with breakpoints b_k = w_k / A_k, so the
  root is found exactly: evaluate f at every breakpoint (O(G^2)), bracket the root between the
  largest breakpoint with f >= 0 and the smallest with f <= 0, read the active set
  {i : w_i - lam A_i > 0} in the middle of that bracket and solve
  lam = sum_act A_i w_i / sum_act A_i^2 (the linear piece through the root).

  Degenerate: |A| = 0 -> w; one side empty -> the non-empty side gets 0 (the unique minimiser).
  Differentiable almost everywhere (through lam's closed form on the fixed active set).
  """
  _check_group(w_G, adv_G)
  nonzero_G = adv_G != 0
  has_pos = jnp.any(adv_G > 0)
  has_neg = jnp.any(adv_G < 0)
  # Breakpoints b_k = w_k / A_k (only where A_k != 0).
  b_G = jnp.where(nonzero_G, w_G / jnp.where(nonzero_G, adv_G, 1.0), 0.0)
  # f at each of the G breakpoints: f_k = sum_j A_j max(w_j - b_k A_j, 0).
  f_G = jnp.sum(adv_G[None, :] * jnp.maximum(w_G[None, :] - b_G[:, None] * adv_G[None, :], 0.0),
                axis=-1)
  lo = jnp.max(jnp.where(nonzero_G & (f_G >= 0), b_G, -jnp.inf))
  hi = jnp.min(jnp.where(nonzero_G & (f_G <= 0), b_G, jnp.inf))
  both_sides = has_pos & has_neg
  lo = jnp.where(both_sides, lo, 0.0)
  hi = jnp.where(both_sides, hi, 0.0)
  mid = 0.5 * (lo + hi)
  active_G = (w_G - mid * adv_G) > 0
  num = jnp.sum(jnp.where(active_G, adv_G * w_G, 0.0))
  den = jnp.sum(jnp.where(active_G, adv_G * adv_G, 0.0))
  lam = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), lo)
  v_both_G = jnp.maximum(w_G - lam * adv_G, 0.0)
  # One side empty (A != 0 somewhere): feasible v must vanish wherever A != 0.
  v_one_side_G = jnp.where(nonzero_G, 0.0, w_G)
  return jnp.where(both_sides, v_both_G, v_one_side_G)


def pos_orth_proj_truncate_rebalance(w_G, adv_G, *, trunc_eps):
  """Positive Orth-Proj by truncate-and-rebalance (paper Eq. 52-55), a one-step closed form.

    s+ = max(w, trunc_eps);  delta = A.s+ = P - N,  P = sum_{A>0} A s+,  N = sum_{A<0} |A| s+.
    delta > 0: scale the A > 0 side by alpha = N / P;  delta < 0: scale the A < 0 side by
    beta = P / N;  delta = 0: s+.

  Result: A.w_tilde = 0 exactly, and when both advantage sides are non-empty alpha, beta lie in
  (0, 1], the unscaled side stays >= trunc_eps and the scaled side >= min(alpha, beta) *
  trunc_eps > 0. (The paper states w_tilde >= eps for all entries; that holds whenever the
  scaled side stays above eps, e.g. for weights near 1, but a scaled entry that was truncated
  to exactly eps ends at alpha * eps < eps. We implement Eq. 54 as written.)
  Degenerate: A = 0 -> s+ unchanged; one side empty (A not centred) -> alpha or beta is 0, so
  the non-empty side is scaled to 0 (the only orthogonal non-negative choice).
  """
  _check_group(w_G, adv_G)
  s_plus_G = jnp.maximum(w_G, trunc_eps)
  pos_G = adv_G > 0
  neg_G = adv_G < 0
  p_mass = jnp.sum(jnp.where(pos_G, adv_G * s_plus_G, 0.0))
  n_mass = jnp.sum(jnp.where(neg_G, -adv_G * s_plus_G, 0.0))
  delta = p_mass - n_mass
  alpha = _safe_div(n_mass, p_mass)
  beta = _safe_div(p_mass, n_mass)
  scale_G = jnp.where(delta > 0, jnp.where(pos_G, alpha, 1.0),
                      jnp.where(delta < 0, jnp.where(neg_G, beta, 1.0), 1.0))
  return scale_G * s_plus_G


def global_scale(w_G, adv_G, *, c):
  """Ablation "DFPO (scale by c)" (paper Table 3): w_tilde = c * w, no in-group coupling."""
  _check_group(w_G, adv_G)
  return c * w_G


TRANSFORMS = {
    'identity': identity,
    'min_replace': min_replace,
    'orth_proj': orth_proj,
    'pos_orth_proj_qp': pos_orth_proj_qp,
    'pos_orth_proj_truncate_rebalance': pos_orth_proj_truncate_rebalance,
    'global_scale': global_scale,
}


def to_groups(x_B, group_size):
  """[B] -> [M, G] with contiguous groups."""
  chex.assert_rank(x_B, 1)
  return x_B.reshape(-1, group_size)


def apply_to_groups(name, w_MG, adv_MG, **kwargs):
  """Applies ``TRANSFORMS[name]`` to every group of ``[M, G]`` arrays (vmap over M)."""
  if name not in TRANSFORMS:
    raise ValueError(f'unknown group transform {name!r}; valid: {sorted(TRANSFORMS)}')
  chex.assert_rank([w_MG, adv_MG], 2)
  chex.assert_equal_shape([w_MG, adv_MG])
  fn = TRANSFORMS[name]
  return jax.vmap(lambda w_G, adv_G: fn(w_G, adv_G, **kwargs))(w_MG, adv_MG)


def transform_batch(name, w_B, adv_B, *, group_size, **kwargs):
  """Applies ``TRANSFORMS[name]`` to contiguous groups of flat [B] arrays; returns [B]."""
  chex.assert_rank([w_B, adv_B], 1)
  chex.assert_equal_shape([w_B, adv_B])
  w_MG = to_groups(w_B, group_size)
  adv_MG = to_groups(adv_B, group_size)
  return apply_to_groups(name, w_MG, adv_MG, **kwargs).reshape(-1)
