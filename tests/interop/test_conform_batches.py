"""jtc.interop.conform_batches: the batches hold what they promise (on-policy ratios of 1, a
group of equal rewards with A = 0, one-token and full rows, extreme ratios) and no ratio sits on
a kink of the objective's clip."""
import numpy as np
import pytest

from jtc.interop import conform_batches


def test_the_batches_hold_what_they_promise():
  batches = {b.name: b for b in conform_batches.make('grpo', {}, seed=0)}
  on = batches['on-policy']
  assert (on.logp_BT == on.old_logp_BT).all()
  eq = batches['equal rewards']
  assert (eq.adv_B[4:8] == 0).all() and np.abs(eq.adv_B).max() > 0
  lengths = batches['short and long'].mask_BT.sum(-1)
  assert set(lengths) == {1, 16}
  ext = batches['extreme ratios']
  log_r = (ext.logp_BT - ext.old_logp_BT)[ext.mask_BT > 0]
  assert log_r.min() < -3 and log_r.max() > 3
  for b in batches.values():  # group advantages: zero mean per group
    np.testing.assert_allclose(b.adv_B.reshape(-1, b.group_size).sum(-1), 0.0, atol=1e-9)
  rows = batches['heavy padding'].rows([0, 1])
  assert rows.shape == (2, int(batches['heavy padding'].mask_BT[:2].sum(-1).max()))


@pytest.mark.parametrize('objective, hp', [('dapo', {}), ('grpo', {
    'dual_clip_c': 3.0
}), ('gspo', {})])
def test_no_ratio_sits_on_a_kink(objective, hp):
  token_points, seq_points = conform_batches.boundaries(objective, hp)
  for b in conform_batches.make(objective, hp, seed=1):
    log_r = np.where(b.mask_BT > 0, b.logp_BT - b.old_logp_BT, 0.0)
    for p in token_points:
      assert not (np.abs(np.exp(log_r[b.mask_BT > 0]) - p) < 1e-4 * p).any()
    s = np.exp(log_r.sum(-1) / np.maximum(b.mask_BT.sum(-1), 1))
    for p in seq_points:
      assert not (np.abs(s - p) < 1e-5 * p).any()


def test_the_kink_mover_moves_a_planted_ratio():
  log_r = np.log(np.array([[1.2, 0.5], [1.0, 1.0]]))
  moved = conform_batches.away_from_kinks(log_r, np.ones((2, 2)), [1.2], [])
  assert abs(np.exp(moved[0, 0]) - 1.2) > 1e-3 and moved[0, 1] == log_r[0, 1]
