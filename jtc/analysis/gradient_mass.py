"""Gradient mass on the sign and the difficulty axes (Don't Let Gains FADE, Decugis et al. 2026,
arXiv 2607.01490: "a unifying framework that decomposes any advantage into its positive and
negative gradient mass (m_S, m_F) along two orthogonal axes").

jtc's reading (only the abstract could be read here; its exact normalisation may differ): the
mass of a token is |c_{b,t}|, c = d loss / d log pi (`diagnostics.loss_coefficients`), the
weight its score grad log pi carries in the update, so every objective is measured the same way
(advantage, ratio, clip, transform and aggregation included). Optionally weighed by
||grad log pi_{b,t}|| (Eq. 24's per-token gradient norm).

  sign axis        m_S: the mass of the tokens the update pushes up (c < 0), m_F: pushed down
                   (c > 0); ``sign_balance`` = m_S / (m_S + m_F) (1/2 balanced, 1 positive only).
  difficulty axis  the mass of each group by its success rate p (the share of its rollouts with a
                   positive advantage: for binary rewards exactly the share solved); shares of the
                   mass on hard (p <= 1/3), medium and easy (p >= 2/3) groups, and the
                   mass-weighted mean p.

Dimension key (docs/dimensions.md): B rows (= M * G), M groups, G group size, T completion length.
"""

import chex
import jax.numpy as jnp

from jtc import checks

DIFFICULTY_EDGES = (1 / 3, 2 / 3)  # p <= 1/3 hard, p >= 2/3 easy


def success_rate(adv_B, *, group_size):
  """[M] share of each group's rollouts with a positive advantage (for binary rewards under
  grpo, dr_grpo and rloo: A > 0 exactly when the rollout is correct and its group is mixed)."""
  chex.assert_rank(adv_B, 1)
  checks.group_size(group_size, adv_B.shape[0])
  return jnp.mean((adv_B > 0).reshape(-1, group_size).astype(jnp.float32), axis=-1)


def gradient_mass(coef_BT, mask_BT, adv_B, *, group_size, grad_norms_BT=None):
  """FADE-style gradient mass of one update (module docstring). Returns float32 scalars:
  'mass_S', 'mass_F', 'sign_balance', 'mass_hard', 'mass_medium', 'mass_easy' (shares of the
  total), 'mass_mean_p' (mass-weighted group success rate). Shares are 0 for a batch without
  mass (every group degenerate)."""
  chex.assert_rank([coef_BT, mask_BT, adv_B], [2, 2, 1])
  chex.assert_equal_shape([coef_BT, mask_BT])
  real_BT = jnp.asarray(mask_BT) > 0
  c_BT = jnp.where(real_BT, jnp.asarray(coef_BT, jnp.float32), 0.0)
  if grad_norms_BT is not None:
    c_BT = c_BT * jnp.asarray(grad_norms_BT, jnp.float32)
  up = jnp.sum(jnp.maximum(-c_BT, 0.0))
  down = jnp.sum(jnp.maximum(c_BT, 0.0))
  total = up + down
  safe = jnp.where(total > 0, total, 1.0)
  p_M = success_rate(adv_B, group_size=group_size)
  mass_M = jnp.sum(jnp.abs(c_BT).reshape(-1, group_size * c_BT.shape[1]), axis=-1)
  lo, hi = DIFFICULTY_EDGES
  share = lambda sel_M: jnp.sum(jnp.where(sel_M, mass_M, 0.0)) / safe
  return {
      'mass_S': up,
      'mass_F': down,
      'sign_balance': jnp.where(total > 0, up / safe, 0.0),
      'mass_hard': share(p_M <= lo),
      'mass_medium': share((p_M > lo) & (p_M < hi)),
      'mass_easy': share(p_M >= hi),
      'mass_mean_p': jnp.sum(mass_M * p_M) / safe,
  }
