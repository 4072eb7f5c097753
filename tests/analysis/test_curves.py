"""Tests of jtc.analysis.curves: Jitter2 (Eq. 20), Compute@threshold (Table 2), entropy trend and the
trailing mean, against closed forms."""
import math

import numpy as np
import pytest

from jtc.analysis import curves


def test_jitter2_closed_forms():
  assert curves.jitter2(3.0 * np.arange(10) + 1.0) == pytest.approx(0.0, abs=1e-12)
  m = [0.0, 1.0, 0.0, 2.0, 5.0]
  # second differences: 0-2+0=-2, 2-0+1=3, 5-4+0=1 -> (2 + 3 + 1) / 3
  assert curves.jitter2(m) == pytest.approx(2.0)
  assert curves.jitter2(np.arange(8)**2) == pytest.approx(2.0)  # constant second difference
  with pytest.raises(ValueError, match='at least 3'):
    curves.jitter2([1.0, 2.0])


def test_compute_at_threshold_and_baseline():
  curve, compute = [0.1, 0.5, 0.6, 0.8, 0.7], [10, 20, 30, 40, 50]
  assert curves.compute_at_threshold(curve, compute, 0.7) == 40
  assert curves.compute_at_threshold(curve, compute, 0.7, interpolate=True) == pytest.approx(35.0)
  assert curves.compute_at_threshold(curve, compute, 0.9) == math.inf
  # trailing mean over 2: [.1, .3, .55, .7, .75] -> first >= .7 at index 3
  assert curves.compute_at_threshold(curve, compute, 0.7, smooth=2) == 40
  ratios = curves.normalise_to_baseline({'gspo': 100.0, 'dfpo': 91.0}, 'gspo')
  assert ratios == pytest.approx({'gspo': 1.0, 'dfpo': 0.91})
  with pytest.raises(ValueError, match="'grpo'"):
    curves.normalise_to_baseline({'gspo': 1.0}, 'grpo')


def test_entropy_trend_recovers_line():
  steps = np.array([0, 2, 3, 7, 10], float)
  out = curves.entropy_trend(2.0 - 0.05 * steps, steps)
  assert out['slope'] == pytest.approx(-0.05)
  assert out['intercept'] == pytest.approx(2.0)
  assert out['r2'] == pytest.approx(1.0)


@pytest.mark.parametrize('window', [1, 2, 5, 50])
def test_trailing_mean_matches_a_loop(window):
  y = np.random.default_rng(window).normal(size=30)
  want = [np.mean(y[max(0, i - window + 1):i + 1]) for i in range(len(y))]
  np.testing.assert_allclose(curves.trailing_mean(y, window), want, rtol=1e-12, atol=1e-12)


def test_trailing_mean_is_causal_and_rejects_bad_windows():
  y = np.zeros(20)
  y[10] = 1.0
  s = curves.trailing_mean(y, 4)
  assert np.all(s[:10] == 0) and np.all(s[10:14] == 0.25) and np.all(s[14:] == 0)
  with pytest.raises(ValueError, match='window=0'):
    curves.trailing_mean(y, 0)
