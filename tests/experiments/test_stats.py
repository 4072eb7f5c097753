"""Tests of experiments/stats.py: the exact paired sign-flip permutation test, the bootstrap CI's
coverage, the ratio-of-means CI."""

import itertools

import numpy as np
import pytest

from experiments import stats


def _brute_force_pvalue(x, y):
  """Independent reference: loop over every sign pattern with itertools, compare means."""
  d = [a - b for a, b in zip(x, y)]
  observed = abs(sum(d) / len(d))
  extreme = 0
  patterns = list(itertools.product((1, -1), repeat=len(d)))
  for signs in patterns:
    flipped = abs(sum(s * v for s, v in zip(signs, d)) / len(d))
    extreme += flipped >= observed - 1e-12
  return extreme / len(patterns)


@pytest.mark.parametrize('n', [2, 3, 5, 8, 11])
def test_signflip_matches_brute_force(n):
  rng = np.random.default_rng(n)
  for trial in range(5):
    x = rng.normal(0.3 * trial, 1.0, size=n)
    y = rng.normal(0.0, 1.0, size=n)
    assert stats.paired_signflip_pvalue(x, y) == pytest.approx(_brute_force_pvalue(x, y), abs=1e-15)


def test_signflip_ties_on_integer_scores():
  # Accuracy-like differences with many exact ties among the flipped sums.
  x = np.array([0.5, 0.75, 0.5, 0.25, 0.5, 0.75])
  y = np.array([0.25, 0.5, 0.5, 0.5, 0.25, 0.5])
  assert stats.paired_signflip_pvalue(x, y) == _brute_force_pvalue(x, y)
  # d = (0.1 + 0.2, -0.3, 0.4) is (0.3, -0.3, 0.4) up to rounding: the 4 patterns with s1 = s2
  # tie with the observed |sum| = 0.4 and 2 more exceed it, so p = 6/8 (rounding must not
  # break ties).
  x, y = [0.1 + 0.2, 0.0, 0.4], [0.0, 0.3, 0.0]
  d = np.subtract(x, y)
  assert abs(-d[0] - d[1] + d[2]) < abs(d.sum())  # a float-rounding non-tie without tolerance
  assert stats.paired_signflip_pvalue(x, y) == 0.75


@pytest.mark.parametrize('n, floor', [(2, 0.5), (5, 0.0625), (8, 0.0078125), (20, 2.0**-19)])
def test_signflip_floor_is_two_over_two_to_the_n(n, floor):
  x = np.arange(1.0, n + 1.0)  # every difference positive: only s = +1 and s = -1 tie
  y = np.zeros(n)
  assert stats.paired_signflip_pvalue(x, y) == floor
  assert stats.min_attainable_p(n) == floor
  assert stats.paired_signflip_pvalue(x, y) >= stats.min_attainable_p(n)


def test_signflip_symmetry_and_shift_invariance():
  rng = np.random.default_rng(0)
  for n in (4, 7, 10):
    x, y = rng.normal(size=n), rng.normal(size=n)
    p = stats.paired_signflip_pvalue(x, y)
    assert stats.paired_signflip_pvalue(y, x) == p
    assert stats.paired_signflip_pvalue(x + 3.0, y + 3.0) == pytest.approx(p)
    perm = rng.permutation(n)
    assert stats.paired_signflip_pvalue(x[perm], y[perm]) == pytest.approx(p)


def test_signflip_zero_difference_is_one_and_few_pairs_nan():
  x = np.array([0.1, 0.7, 0.3, 0.9])
  assert stats.paired_signflip_pvalue(x, x) == 1.0
  assert stats.paired_signflip_pvalue(x, x.copy()) == 1.0
  assert stats.paired_signflip_pvalue([1.0, -1.0], [0.0, 0.0]) == 1.0  # mean difference 0
  assert np.isnan(stats.paired_signflip_pvalue([1.0], [0.0]))
  assert np.isnan(stats.min_attainable_p(1))


def test_signflip_detects_a_clear_shift_and_not_noise():
  rng = np.random.default_rng(1)
  base = rng.normal(size=12)
  assert stats.paired_signflip_pvalue(base + 2.0 + 0.1 * rng.normal(size=12), base) == 2.0**-11
  assert stats.paired_signflip_pvalue(base + 0.05 * rng.normal(size=12), base) > 0.05


def test_signflip_monte_carlo_above_the_exact_limit():
  n = stats.MAX_EXACT_PAIRS + 4
  rng = np.random.default_rng(2)
  x, y = rng.normal(0.2, 1.0, size=n), rng.normal(size=n)
  p = stats.paired_signflip_pvalue(x, y, num_resamples=20_000, seed=5)
  assert p == stats.paired_signflip_pvalue(x, y, num_resamples=20_000, seed=5)  # seeded
  # The exact p of n = 24 pairs, computed by enumerating all 2^24 patterns in blocks.
  d = x - y
  exact_extreme = 0
  for start in range(0, 2**n, 1 << 20):
    codes = np.arange(start, start + (1 << 20))[:, None]
    signs = 1.0 - 2.0 * ((codes >> np.arange(n)) & 1)
    exact_extreme += np.count_nonzero(np.abs(signs @ d) >= abs(d.sum()) - 1e-9)
  exact = exact_extreme / 2**n
  assert abs(p - exact) < 4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4
  assert stats.min_attainable_p(n, num_resamples=99) == 0.01
  assert stats.paired_signflip_pvalue(np.arange(1.0, n + 1), np.zeros(n), num_resamples=99) == 0.01


def test_signflip_bad_input():
  with pytest.raises(ValueError, match='equal lengths'):
    stats.paired_signflip_pvalue([1.0, 2.0], [1.0])
  with pytest.raises(ValueError, match='non-finite'):
    stats.paired_signflip_pvalue([1.0, float('nan')], [1.0, 2.0])
  with pytest.raises(ValueError, match='n=-1'):
    stats.min_attainable_p(-1)
  with pytest.raises(ValueError, match='n=2.5'):
    stats.min_attainable_p(2.5)


def _holm_reference(p):
  """Holm by its definition: reject H_(k) iff p_(j) <= alpha / (m - j + 1) for all j <= k; the
  adjusted p is the smallest alpha at which H_k is rejected (searched on a fine grid)."""
  m = len(p)
  order = np.argsort(p)
  out = np.empty(m)
  for k in range(m):
    out[order[k]] = max(min(1.0, (m - j) * p[order[j]]) for j in range(k + 1))
  return out


def test_holm_and_bh_on_a_worked_example_and_a_reference():
  p = np.array([0.01, 0.04, 0.03, 0.005])
  # Holm: sorted 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1 -> 0.02, 0.03, 0.06, max(0.06, 0.04).
  np.testing.assert_allclose(stats.holm(p), [0.03, 0.06, 0.06, 0.02])
  # BH: sorted 0.005 x 4/1, 0.01 x 4/2, 0.03 x 4/3, 0.04 x 4/4, then cumulative min from the top.
  np.testing.assert_allclose(stats.benjamini_hochberg(p), [0.02, 0.04, 0.04, 0.02])
  rng = np.random.default_rng(0)
  for _ in range(20):
    p = rng.uniform(size=7)**3
    np.testing.assert_allclose(stats.holm(p), _holm_reference(p))
    q = stats.benjamini_hochberg(p)
    assert np.all(q >= p - 1e-15) and np.all(stats.holm(p) >= q - 1e-15)  # BH is the laxer
  # A NaN (a claim with no data) is neither counted nor adjusted.
  out = stats.holm([0.01, np.nan, 0.02])
  assert np.isnan(out[1]) and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.02)


def test_holm_controls_the_family_wise_error_under_the_global_null():
  rng = np.random.default_rng(1)
  p = rng.uniform(size=(4000, 6))
  any_rejected = np.mean([np.any(stats.holm(row) < 0.05) for row in p])
  assert any_rejected <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)
  assert np.mean(np.any(p < 0.05, axis=1)) > 0.2  # uncorrected, the same data reject often


def test_t_ci_covers_at_the_nominal_rate_and_is_wider_than_the_percentile_bootstrap():
  rng = np.random.default_rng(2)
  covered, wider = 0, 0
  for i in range(600):
    d = rng.normal(1.0, 2.0, size=8)
    mean, lo, hi = stats.t_ci(d)
    covered += lo <= 1.0 <= hi
    _, blo, bhi = stats.bootstrap_ci(d, num_resamples=2000, seed=i)
    wider += (hi - lo) > (bhi - blo)
  assert abs(covered / 600 - 0.95) < 3 * np.sqrt(0.05 * 0.95 / 600)
  assert wider / 600 > 0.9


def test_tost_concludes_equivalence_only_inside_the_bounds():
  rng = np.random.default_rng(3)
  tight = rng.normal(0.0, 0.5, size=16)
  assert stats.tost_pvalue(tight, 1.0) < 0.05  # a small, precise difference: equivalent
  assert stats.tost_pvalue(rng.normal(0.0, 5.0, size=16), 1.0) > 0.05  # imprecise: no
  assert stats.tost_pvalue(tight + 2.0, 1.0) > 0.5  # precise but outside +-1: no
  assert stats.tost_pvalue(np.zeros(16), 1.0) == 0.0  # exactly 0 every time (a negative control)
  # Size: at the boundary (true mean = sesoi) equivalence is concluded at most 5% of the time.
  hits = np.mean([stats.tost_pvalue(rng.normal(1.0, 1.0, 16), 1.0) < 0.05 for _ in range(2000)])
  assert hits <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 2000)
  with pytest.raises(ValueError, match='sesoi'):
    stats.tost_pvalue(tight, 0.0)


def test_exact_signflip_reaches_below_the_eight_seed_floor_with_sixteen():
  x, y = np.arange(1.0, 17.0), np.zeros(16)
  assert stats.paired_signflip_pvalue(x, y) == 2.0**-15
  # Holm's smallest threshold over a family of seven is 0.05 / 7: out of reach with 8 seeds.
  assert stats.min_attainable_p(16) < 0.05 / 7 < stats.min_attainable_p(8)


def test_bootstrap_ci_covers_true_mean_at_about_nominal_rate():
  rng = np.random.default_rng(123)
  true_mean, n, trials = 1.5, 20, 300
  covered = 0
  for i in range(trials):
    x = rng.normal(true_mean, 2.0, size=n)
    mean, lo, hi = stats.bootstrap_ci(x, num_resamples=1000, seed=i)
    assert mean == pytest.approx(x.mean())
    assert lo <= mean <= hi
    covered += lo <= true_mean <= hi
  # Percentile bootstrap slightly under-covers at n = 20 (about 0.93); 300 trials -> sd 0.015.
  assert 0.87 <= covered / trials <= 0.985


def test_bootstrap_ci_is_seeded_and_narrows_with_more_data():
  x = np.random.default_rng(0).normal(size=50)
  assert stats.bootstrap_ci(x, seed=7) == stats.bootstrap_ci(x, seed=7)
  _, lo_small, hi_small = stats.bootstrap_ci(x[:10], seed=0)
  _, lo_big, hi_big = stats.bootstrap_ci(x, seed=0)
  assert hi_big - lo_big < hi_small - lo_small
  # One seed: a mean, no interval.
  mean, lo, hi = stats.bootstrap_ci([3.0])
  assert mean == 3.0 and np.isnan(lo) and np.isnan(hi)


def test_paired_pvalue_small_for_clear_shift_large_for_none():
  rng = np.random.default_rng(1)
  base = rng.normal(50.0, 5.0, size=8)  # large between-seed spread ...
  shifted = base + 2.0 + rng.normal(0, 0.3, size=8)  # ... but a consistent paired shift
  assert stats.paired_bootstrap_pvalue(shifted, base) < 0.01
  # The same shift unpaired would be buried in the spread: pairing is what detects it.
  assert stats.bootstrap_ci(shifted)[1] < base.mean() < stats.bootstrap_ci(shifted)[2]
  noise = base + rng.normal(0, 0.3, size=8)
  noise = noise - (noise - base).mean()  # zero mean difference (up to rounding)
  assert stats.paired_bootstrap_pvalue(noise, base) > 0.9
  assert stats.paired_bootstrap_pvalue(base, base) == 1.0


def test_paired_pvalue_is_roughly_calibrated_under_the_null():
  rng = np.random.default_rng(2)
  pvals = [
      stats.paired_bootstrap_pvalue(rng.normal(size=12), rng.normal(size=12), num_resamples=500,
                                    seed=i) for i in range(200)
  ]
  pvals = np.array(pvals)
  assert np.all((pvals > 0) & (pvals <= 1))
  # Bootstrap tests are a bit liberal at small n; a broken test gives ~0 or ~1 here.
  assert 0.01 <= np.mean(pvals < 0.05) <= 0.12
  assert 0.35 <= np.median(pvals) <= 0.65


def test_paired_pvalue_is_symmetric_and_bounded_by_resamples():
  x, y = np.array([1.0, 2.0, 3.5, 4.0]), np.array([0.0, 0.5, 1.0, 1.5])
  assert stats.paired_bootstrap_pvalue(x, y, seed=3) == stats.paired_bootstrap_pvalue(y, x, seed=3)
  assert stats.paired_bootstrap_pvalue(x, y, num_resamples=99) >= 1 / 100


def test_ratio_of_means_ci_exact_ratio_and_bad_input():
  y = np.array([1.0, 2.0, 4.0, 3.0])
  r, lo, hi = stats.ratio_of_means_ci(0.5 * y, y)
  assert (r, lo, hi) == pytest.approx((0.5, 0.5, 0.5))
  with pytest.raises(ValueError, match='equal lengths'):
    stats.paired_bootstrap_pvalue([1.0, 2.0], [1.0])
  with pytest.raises(ValueError, match='non-finite'):
    stats.bootstrap_ci([1.0, float('nan')])
  with pytest.raises(ValueError, match='level'):
    stats.bootstrap_ci([1.0, 2.0], level=95)
