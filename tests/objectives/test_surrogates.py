"""Tests of jtc.objectives.surrogates: each loss's closed forms from the papers (shared-token
cancellation, GSPO's Eq. 13 and 38, GRPO outside its clip, Theorem C.1, DFPO's two readings of
GSPO's clip, the ablations), through `compute_loss`."""
import math

import numpy as np
import pytest

from jtc.objectives import surrogates
from tests.objectives.loss_reference import B, run, run_all_aggregations, np_reference, reference_inputs, off_policy_inputs


def _shared_group(seed, *, shared_log_ratio, g=4, t=6, noise=0.3):
  """One group of equal-length completions sharing (context, token) at t < len(shared)."""
  rng = np.random.default_rng(seed)
  logps = rng.normal(-1.0, 0.5, (g, t))
  old = logps + rng.normal(0.0, noise, (g, t))
  for j, lr in enumerate(shared_log_ratio):
    logps[:, j] = logps[0, j]
    old[:, j] = logps[0, j] - lr
  adv = rng.normal(size=g)
  adv -= adv.mean()
  return logps, old, adv, np.ones((g, t))


@pytest.mark.parametrize(
    'name,hp,shared',
    [
        ('grpo', {}, [0.1, -0.1, 0.05]),  # inside the clip range
        ('dapo', {}, [0.2, -0.15]),
        ('grpo_fix', {}, [0.6, -0.8, 0.0]),  # any ratio
        ('grpo_fix', {
            'aggregation': 'token_mean'
        }, [0.6, -0.8]),
        ('dfpo_min_replace', {}, [0.5, -0.3]),
        ('dfpo_orth_proj', {}, [0.5, -0.3]),
        ('dfpo_pos_orth_proj', {}, [0.5, -0.3]),
        ('dfpo_pos_orth_proj', {
            'solver': 'truncate_rebalance'
        }, [0.5, -0.3]),
        ('dfpo_min_replace', {
            'aggregation': 'token_mean'
        }, [0.5, -0.3]),
    ])
def test_shared_token_gradient_cancels(name, hp, shared):
  logps, old, adv, mask = _shared_group(2, shared_log_ratio=shared)
  _, _, grad = run(name, logps, old, adv, mask, group_size=4, **hp)
  group_sum = grad.sum(axis=0)
  np.testing.assert_allclose(group_sum[:len(shared)], 0.0, atol=1e-6)
  assert np.abs(grad).max() > 1e-3  # the loss does learn elsewhere


def test_gspo_shared_token_eq13_closed_form():
  """Eq. 13 with Eq. 44 ratios: sum_i dJ/dlogp_{i,t*} = (1/G)(1/T) sum_i A_i s_i (non-zero)."""
  g, t = 4, 6
  logps, old, adv, mask = _shared_group(3, shared_log_ratio=[0.1, -0.2], g=g, t=t)
  _, _, grad = run('gspo', logps, old, adv, mask, group_size=g, eps=10.0)  # linear segment
  s = np.exp((logps - old).mean(axis=1))
  expected = np.sum(adv * s) / (g * t)
  np.testing.assert_allclose(-grad.sum(axis=0)[:2], expected, rtol=1e-5)
  assert abs(expected) > 1e-3  # no cancellation


def test_gspo_eq38_minimal_case():
  """App. A.2: G=2, T=3, shared (rho1, rho2), last tokens lambda1 != lambda2, A = (-a, a)."""
  a, rho1, rho2, lam1, lam2 = 0.7, 1.1, 0.95, 1.3, 0.8
  logps = np.log(np.array([[0.3, 0.5, 0.2], [0.3, 0.5, 0.6]]))
  ratios = np.array([[rho1, rho2, lam1], [rho1, rho2, lam2]])
  old = logps - np.log(ratios)
  _, _, grad = run('gspo', logps, old, np.array([-a, a]), np.ones((2, 3)), group_size=2, eps=10.0)
  # Eq. 38 with length-normalised weights s_i = (rho1 rho2 lambda_i)^(1/3), times 1/G * 1/T.
  eq38 = a * (rho1 * rho2)**(1 / 3) * (lam2**(1 / 3) - lam1**(1 / 3))
  np.testing.assert_allclose(-grad.sum(axis=0)[:2], eq38 / (2 * 3), rtol=1e-5)


@pytest.mark.parametrize('w,eq', [(1.5, 75), (0.6, 76)])
def test_grpo_outside_clip_range_eq75_76(w, eq):
  a, eps = 0.8, 0.2
  adv = np.array([-a, a])
  # Value: only the shared token is real, so the loss is -(1/G) * (Eq. 75/76 coefficient).
  logps = np.full((2, 1), -1.0)
  old = logps - math.log(w)
  loss, _, grad = run('grpo', logps, old, adv, np.ones((2, 1)), group_size=2)
  coef = a * ((1 + eps) - w) if eq == 75 else a * (w - (1 - eps))
  np.testing.assert_allclose(-loss, coef / 2, rtol=1e-5)
  assert abs(coef) > 1e-3
  # Gradient: only the unclipped branch moves (w > 1+eps: the A<0 one; w < 1-eps: the A>0 one).
  expected = (-a * w if eq == 75 else a * w) / 2
  np.testing.assert_allclose(-grad.sum(axis=0), expected, rtol=1e-5)
  # Same at a shared position inside longer completions (1/T from seq_mean_token_mean).
  logps, old, _, mask = _shared_group(4, shared_log_ratio=[math.log(w)], g=2, t=4)
  _, _, grad = run('grpo', logps, old, adv, mask, group_size=2)
  np.testing.assert_allclose(-grad.sum(axis=0)[0], expected / 4, rtol=1e-5)


def test_theorem_c1_min_replace_never_reverses_updates():
  logps, old, adv, mask, _, _, _ = reference_inputs(5, noise=0.4)
  keep = mask > 0
  _, _, g_min = run('dfpo_min_replace', logps, old, adv, mask, eps=10.0)
  _, _, g_base = run('gspo', logps, old, adv, mask, eps=10.0)  # Eq. 86 coefficient s_i A_i
  np.testing.assert_array_equal(np.sign(g_min[keep]), np.sign(g_base[keep]))
  phi = g_min[keep] / g_base[keep]
  assert np.all(phi > 0) and np.all(phi <= 1 + 1e-6)


@pytest.mark.parametrize('name,hp', [('dfpo_min_replace', {}), ('dfpo_orth_proj', {}),
                                     ('dfpo_pos_orth_proj', {}),
                                     ('dfpo_pos_orth_proj', {
                                         'solver': 'truncate_rebalance'
                                     })])
def test_no_stop_gradient_is_identically_zero(name, hp):
  """Documented identity: sum_i A_i = 0 and equal per-completion weights => J == 0."""
  logps, old, adv, mask, _, _, _ = reference_inputs(6, noise=0.4)
  mask[3, :2] = 1.0  # every completion real: equal weight 1/B per completion
  loss, _, grad = run(name, logps, old, adv, mask, stop_gradient=False, eps=0.1, **hp)
  assert abs(loss) < 1e-6
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)
  _, _, grad_sg = run(name, logps, old, adv, mask, stop_gradient=True, eps=0.1, **hp)
  assert np.abs(grad_sg).max() > 1e-3  # the default (stop-grad) variant does learn


def test_global_scale_without_stop_gradient_is_scaled_gspo():
  logps, old, adv, mask, _, _, _ = reference_inputs(7)
  loss_g, _, grad_g = run('gspo', logps, old, adv, mask, eps=0.1)
  loss_s, _, grad_s = run('dfpo_orth_proj', logps, old, adv, mask, eps=0.1, global_scale=0.5,
                          stop_gradient=False)
  np.testing.assert_allclose(loss_s, 0.5 * loss_g, rtol=1e-5)
  np.testing.assert_allclose(grad_s, 0.5 * grad_g, rtol=1e-5, atol=1e-7)


def test_gspo_token_equals_gspo():
  logps, old, adv, mask, _, _, _ = reference_inputs(8)
  for a, b in zip(run_all_aggregations('gspo', logps, old, adv, mask, eps=0.05),
                  run_all_aggregations('gspo_token', logps, old, adv, mask, eps=0.05)):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    np.testing.assert_allclose(a[2], b[2], rtol=1e-5, atol=1e-8)


DFPO_LOSSES = ('dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj')


def test_off_policy_inputs_clip_some_trajectories():
  *_, clipped = off_policy_inputs()
  assert 0 < clipped.sum() < B - 1


@pytest.mark.parametrize('name', DFPO_LOSSES)
def test_clip_gating_closed_forms(name):
  """Both readings have the value A_i s_tilde_i; literal: every trajectory's tokens carry
  s_tilde_i A_i alpha_{i,t}; gated: the same where GSPO's clip is inactive and exactly 0 where
  it is active (numpy reference with the gate)."""
  logps, old, adv, mask, clipped = off_policy_inputs()
  for gating in surrogates.CLIP_GATINGS:
    hp = {'clip_gating': gating, 'aggregation': 'seq_mean_token_mean'}
    loss, metrics, grad = run(name, logps, old, adv, mask, **hp)
    ref_loss, ref_grad, ref_metrics = np_reference(name, logps, old, adv, mask, hp)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(metrics['asym_gated'], ref_metrics['asym_gated'], rtol=1e-4)
    if gating == 'gspo':
      assert np.all(grad[clipped] == 0.0)
      assert metrics['frac_traj_gated'] == pytest.approx(clipped.sum() / (mask.sum(1) > 0).sum())
    else:
      assert np.all(np.abs(grad[clipped & (mask.sum(1) > 0)]).sum(1) > 0)
      assert metrics['frac_traj_gated'] == 0.0


def test_gated_min_replace_coefficients_never_exceed_gspo_theorem_c1():
  """Thm C.1 under GSPO's gating: |coefficient| <= GSPO's per token, same sign where non-zero,
  and exactly 0 on the trajectories GSPO drops. The literal reading exceeds GSPO there."""
  logps, old, adv, mask, clipped = off_policy_inputs()
  _, _, g_gspo = run('gspo', logps, old, adv, mask)
  _, _, g_gated = run('dfpo_min_replace', logps, old, adv, mask, clip_gating='gspo')
  _, _, g_literal = run('dfpo_min_replace', logps, old, adv, mask)
  assert np.all(np.abs(g_gated) <= np.abs(g_gspo) * (1 + 1e-6) + 1e-9)
  nz = g_gated != 0
  np.testing.assert_array_equal(np.sign(g_gated[nz]), np.sign(g_gspo[nz]))
  assert np.abs(g_literal[clipped]).sum() > 0 and np.all(g_gspo[clipped] == 0)


def test_shared_tokens_cancel_without_gating_and_not_with_it():
  """Literal DFPO cancels exactly on shared tokens whatever the clip does; the gated reading
  cancels only among kept trajectories, so it cancels when the clip is inactive."""
  logps, old, adv, mask = _shared_group(2, shared_log_ratio=[0.5, -0.3], noise=0.3)
  _, _, g_literal = run('dfpo_min_replace', logps, old, adv, mask, group_size=4)
  np.testing.assert_allclose(g_literal.sum(axis=0)[:2], 0.0, atol=1e-7)
  _, m, g_gated = run('dfpo_min_replace', logps, old, adv, mask, group_size=4, clip_gating='gspo')
  assert 0 < m['frac_traj_gated'] < 1
  assert np.abs(g_gated.sum(axis=0)[:2]).max() > 1e-4
  _, m, g_wide = run('dfpo_min_replace', logps, old, adv, mask, group_size=4, clip_gating='gspo',
                     eps=10.0)
  assert m['frac_traj_gated'] == 0.0
  np.testing.assert_allclose(g_wide.sum(axis=0)[:2], 0.0, atol=1e-7)


def test_gated_global_scale_is_exactly_c_times_gspo():
  """Table 3 "scale by c" under the gated reading is c x GSPO's gradient (a smaller step);
  the literal reading carries more than c x GSPO's mass (it keeps the clipped trajectories)."""
  logps, old, adv, mask, _ = off_policy_inputs()
  _, m_g, g_gspo = run('gspo', logps, old, adv, mask)
  _, m_s, g_s = run('dfpo_min_replace', logps, old, adv, mask, global_scale=0.5, clip_gating='gspo')
  np.testing.assert_allclose(g_s, 0.5 * g_gspo, rtol=1e-5, atol=1e-9)
  assert m_s['coef_mass_vs_gspo'] == pytest.approx(0.5, rel=1e-5)
  _, m_lit, _ = run('dfpo_min_replace', logps, old, adv, mask, global_scale=0.5)
  assert m_lit['coef_mass_vs_gspo'] > 0.5 + 1e-3
  assert m_g['coef_mass_vs_gspo'] == pytest.approx(1.0)
