"""Tests of jtc.analysis.gradient_mass: closed forms of GRPO and Dr. GRPO on-policy (the sign axis
balanced, the difficulty axis sqrt(p (1 - p)) vs p (1 - p)), the positive-only control (all mass
pushes up) and the negative control (degenerate groups carry no mass)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import objectives
from jtc.analysis import diagnostics
from jtc.analysis import gradient_mass
from jtc.objectives import advantages

G, T = 6, 3
REWARDS = np.array([1, 0, 0, 0, 0, 0] + [1, 1, 1, 0, 0, 0] + [1, 1, 1, 1, 1, 0] +
                   [1, 1, 1, 1, 1, 1], np.float32)  # p = 1/6, 1/2, 5/6 and a degenerate group


def _mass(adv_name, loss_name='grpo', sign='both', rewards=REWARDS):
  adv_B, _ = advantages.compute_advantages(adv_name, jnp.asarray(rewards), group_size=G)
  adv_B = advantages.keep_sign(adv_B, sign)
  b = adv_B.shape[0]
  logps = jnp.full((b, T), -1.0)
  hp = objectives.default_hparams(loss_name)
  hp['aggregation'] = 'seq_mean_token_mean'
  coef_fn = jax.jit(lambda lp, adv: diagnostics.loss_coefficients(
      lp, loss_name=loss_name, old_logps=lp, advantages=adv, mask=jnp.ones(
          (b, T)), group_size=G, **hp)[0])
  coef = coef_fn(logps, adv_B)
  return gradient_mass.gradient_mass(coef, jnp.ones((b, T)), adv_B, group_size=G), adv_B


@pytest.mark.parametrize('loss_name', ['grpo', 'gspo', 'dfpo_min_replace'])
def test_on_policy_mass_is_balanced_and_grpo_weighs_groups_by_sqrt_p_1_minus_p(loss_name):
  m, adv = _mass('grpo', loss_name)
  assert float(m['sign_balance']) == pytest.approx(0.5, abs=1e-6)  # sum_i A_i = 0 per group
  # seq_mean_token_mean: every row's sum_t |c| = |A| / B, and sum_i |A_i| = 2 G sqrt(p (1 - p)).
  p = np.array([1 / 6, 1 / 2, 5 / 6, 1.0])
  per_group = np.sqrt(p * (1 - p))
  share = per_group / per_group.sum()
  assert float(m['mass_hard']) == pytest.approx(share[0], rel=1e-4)
  assert float(m['mass_medium']) == pytest.approx(share[1], rel=1e-4)
  assert float(m['mass_easy']) == pytest.approx(share[2], rel=1e-4)
  assert float(m['mass_mean_p']) == pytest.approx(float((share * p).sum()), rel=1e-4)
  np.testing.assert_allclose(gradient_mass.success_rate(adv, group_size=G),
                             [1 / 6, 1 / 2, 5 / 6, 0.0])


def test_dr_grpo_weighs_groups_by_p_1_minus_p():
  m, _ = _mass('dr_grpo')
  p = np.array([1 / 6, 1 / 2, 5 / 6])
  share = p * (1 - p) / (p * (1 - p)).sum()
  assert float(m['mass_medium']) == pytest.approx(share[1], rel=1e-4)


def test_positive_only_pushes_everything_up_and_degenerate_groups_carry_nothing():
  m, _ = _mass('grpo', sign='positive')
  assert float(m['sign_balance']) == 1.0 and float(m['mass_F']) == 0.0
  m, _ = _mass('grpo', rewards=np.ones(4 * G, np.float32))
  assert float(m['mass_S']) == float(m['mass_F']) == float(m['sign_balance']) == 0.0
  assert float(m['mass_hard']) == 0.0
