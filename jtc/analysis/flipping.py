"""Token flipping: which tokens an update made more or less likely, by the sign of their rollout's
advantage (the Cancellation Hypothesis, Cheng et al. 2026, arXiv 2605.08666: "positive and
negative rollouts exhibit remarkably similar proportions of tokens whose probabilities are
boosted or suppressed during RL training").

Exact, not first-order: every completion token is re-scored in the same context with the
parameters before and after the update (`rescore`), and its change Delta = log pi_after -
log pi_before is classified boosted (Delta > tol), suppressed (Delta < -tol) or unchanged.
The sequence-level reading of RL says the tokens of positive-advantage rollouts go up and those
of negative ones down; a token against its rollout's sign is "flipped". `jtc.analysis.coupling`
explains a token's change by the other tokens of the update.

Dimension key (docs/dimensions.md): B rows, T completion length.
"""

import chex
import jax.numpy as jnp
import numpy as np

TOL = 1e-6  # nats: |Delta| at or below this is "unchanged" (float32 re-scoring noise is ~1e-7)


def rescore(logps_fn, params_before, params_after):
  """[B, T] exact change log pi_after - log pi_before of every token in its own context."""
  return logps_fn(params_after) - logps_fn(params_before)


def classify(delta_BT, mask_BT, *, tol=TOL):
  """[B, T] int8: +1 boosted, -1 suppressed, 0 unchanged or padding."""
  chex.assert_equal_shape([delta_BT, mask_BT])
  real_BT = jnp.asarray(mask_BT) > 0
  sign_BT = jnp.where(delta_BT > tol, 1, jnp.where(delta_BT < -tol, -1, 0))
  return jnp.where(real_BT, sign_BT, 0).astype(jnp.int8)


def shares(delta_BT, mask_BT, adv_B, *, tol=TOL):
  """The shares of boosted / suppressed tokens among the real tokens of positive- and of
  negative-advantage rollouts (zero-advantage rollouts are left out), the gap between the two
  boosted shares (positive - negative: 1 for the sequence-level reading, 0 for "remarkably
  similar proportions"), and the flipped share (suppressed tokens of positive rollouts and
  boosted tokens of negative ones, over the tokens of both). NaN where a side has no token."""
  chex.assert_rank([delta_BT, mask_BT, adv_B], [2, 2, 1])
  cls_BT = np.asarray(classify(delta_BT, mask_BT, tol=tol))
  real_BT = np.asarray(mask_BT) > 0
  adv_B = np.asarray(adv_B)
  out = {}
  for side, rows_B in (('pos', adv_B > 0), ('neg', adv_B < 0)):
    sel = real_BT & rows_B[:, None]
    n = sel.sum()
    out[f'boosted_{side}'] = float((cls_BT[sel] > 0).sum() / n) if n else np.nan
    out[f'suppressed_{side}'] = float((cls_BT[sel] < 0).sum() / n) if n else np.nan
    out[f'tokens_{side}'] = int(n)
  out['boosted_gap'] = out['boosted_pos'] - out['boosted_neg']
  n = out['tokens_pos'] + out['tokens_neg']
  flipped = (out['suppressed_pos'] * out['tokens_pos'] if out['tokens_pos'] else
             0.0) + (out['boosted_neg'] * out['tokens_neg'] if out['tokens_neg'] else 0.0)
  out['flipped'] = float(flipped / n) if n else np.nan
  return out
