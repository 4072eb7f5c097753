"""Statistics over seeds: bootstrap and t intervals, the exact paired sign-flip test, Holm and
Benjamini-Hochberg corrections, TOST equivalence.

Every function draws from its own `np.random.default_rng(seed)`, so a table rebuilt from the
same per-run summaries prints the same intervals and p-values on any machine.

Conventions
  * `bootstrap_ci(x)`: the mean of `x` and the percentile interval of the means of
    `num_resamples` resamples of `x` drawn with replacement (Efron's percentile bootstrap).
  * `paired_bootstrap_pvalue(x, y)`: x[i] and y[i] come from the same seed. With d = x - y,
    the null "E[d] = 0" is imposed by centring the differences (d - mean(d)); the two-sided
    p-value is the share of resampled centred means at least as far from 0 as the observed
    mean, with the +1 correction, p = (1 + #{|mean(d*_b) - mean(d)| >= |mean(d)|}) / (1 + B).
    It is 1 when the mean difference is 0 (up to float rounding) and at least 1 / (1 + B).
  * `paired_signflip_pvalue(x, y)`: the paired permutation test of "x - y is symmetric about
    0". Under that null every sign pattern of d = x - y is equally likely, so the two-sided
    p-value is the share of the 2^n patterns s whose |mean(s * d)| >= |mean(d)| (ties within a
    relative float tolerance count as extreme). For n <= `MAX_EXACT_PAIRS` all 2^n patterns
    are enumerated (exact; no randomness); above that `num_resamples` random patterns from
    `np.random.default_rng(seed)` are drawn and p = (1 + #extreme) / (1 + num_resamples).
    The exact p is a multiple of 1 / 2^n and at least 2 / 2^n (the observed pattern and its
    mirror), so with 5 seeds no difference can reach p < 0.0625: `min_attainable_p(n)`.
  * Fewer than two values (or pairs) give NaN intervals and p-values: one seed says nothing
    about the spread.
"""

import numpy as np
import scipy.stats

DEFAULT_RESAMPLES = 10_000
MAX_EXACT_PAIRS = 20  # paired_signflip_pvalue enumerates all 2^n sign patterns up to this n
_TIE_TOL = 1e-9  # a pattern's |sum| within this x sum|d| of the observed one is a tie
_PATTERN_CHUNK = 1 << 16  # sign patterns scored per vectorised block (bounds memory)
_ZERO_TOL = 1e-12  # |mean(x - y)| below this x max|x|, |y| counts as exactly 0


def _as_1d(x, name):
  x = np.asarray(x, np.float64)
  if x.ndim != 1:
    raise ValueError(f'{name} must be 1-D (one value per seed), got shape {x.shape}')
  if not np.all(np.isfinite(x)):
    raise ValueError(f'{name} has non-finite values {x.tolist()}; drop them before calling')
  return x


def _check_level(level):
  if not 0.0 < level < 1.0:
    raise ValueError(f'level={level!r} must be in (0, 1)')


def _resampled_means(x, *, num_resamples, seed):
  """[num_resamples] means of resamples of `x` with replacement."""
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(x), size=(num_resamples, len(x)))
  return x[idx].mean(axis=1)


def bootstrap_ci(x, *, level=0.95, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """(mean, lo, hi): the mean of `x` and its percentile-bootstrap `level` interval."""
  x = _as_1d(x, 'x')
  _check_level(level)
  if len(x) == 0:
    return float('nan'), float('nan'), float('nan')
  mean = float(x.mean())
  if len(x) < 2:
    return mean, float('nan'), float('nan')
  means = _resampled_means(x, num_resamples=num_resamples, seed=seed)
  alpha = (1.0 - level) / 2.0
  lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
  return mean, float(lo), float(hi)


def _paired(x, y):
  x, y = _as_1d(x, 'x'), _as_1d(y, 'y')
  if x.shape != y.shape:
    raise ValueError(f'paired samples need equal lengths, got {len(x)} and {len(y)}')
  return x, y


def paired_bootstrap_pvalue(x, y, *, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """Two-sided paired bootstrap p-value of H0: E[x - y] = 0 (see the module docstring)."""
  x, y = _paired(x, y)
  d = x - y
  if len(d) < 2:
    return float('nan')
  observed = abs(d.mean())
  if observed <= _ZERO_TOL * max(np.abs(x).max(), np.abs(y).max(), 1e-300):
    return 1.0  # no difference beyond float rounding
  means = _resampled_means(d - d.mean(), num_resamples=num_resamples, seed=seed)
  extreme = np.count_nonzero(np.abs(means) >= observed)
  return float((1 + extreme) / (1 + num_resamples))


def ratio_of_means_ci(x, y, *, level=0.95, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """(mean(x) / mean(y), lo, hi), resampling the same-seed pairs (x[i], y[i]) together."""
  x, y = _paired(x, y)
  _check_level(level)
  if len(x) == 0 or y.mean() == 0:
    return float('nan'), float('nan'), float('nan')
  ratio = float(x.mean() / y.mean())
  if len(x) < 2:
    return ratio, float('nan'), float('nan')
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(x), size=(num_resamples, len(x)))
  den = y[idx].mean(axis=1)
  ratios = x[idx].mean(axis=1)[den != 0] / den[den != 0]
  alpha = (1.0 - level) / 2.0
  lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
  return ratio, float(lo), float(hi)


def _check_num_pairs(n):
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
    raise ValueError(f'n={n!r} must be a non-negative integer number of pairs')


def min_attainable_p(n, *, num_resamples=DEFAULT_RESAMPLES):
  """Smallest p-value `paired_signflip_pvalue` can return for `n` pairs.

  2 / 2^n when the test is exact (n <= `MAX_EXACT_PAIRS`): 0.0625 for 5 seeds, 0.0078125
  for 8; 1 / (1 + num_resamples) above that (Monte Carlo); NaN for n < 2 (no test).
  """
  _check_num_pairs(n)
  if n < 2:
    return float('nan')
  if n <= MAX_EXACT_PAIRS:
    return 2.0**(1 - n)
  return 1.0 / (1 + num_resamples)


def _sign_patterns(start, stop, n):
  """[stop - start, n] float64 signs +-1: row r holds the bits of pattern number start + r."""
  codes = np.arange(start, stop, dtype=np.int64)[:, None]
  bits = (codes >> np.arange(n, dtype=np.int64)[None, :]) & 1
  return 1.0 - 2.0 * bits


def paired_signflip_pvalue(x, y, *, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """Two-sided paired sign-flip (permutation) p-value of H0: mean(x - y) = 0.

  x[i] and y[i] come from the same seed. With d = x - y, the p-value is the share of sign
  patterns s in {-1, +1}^n with |sum(s * d)| >= |sum(d)| (equivalently of the means), a
  pattern within `_TIE_TOL` x sum|d| of the observed value counting as a tie (extreme).

  Args:
    x, y: 1-D paired samples of equal length n.
    num_resamples: random sign patterns drawn when n > `MAX_EXACT_PAIRS` (Monte Carlo, with
      the +1 correction p = (1 + #extreme) / (1 + num_resamples)); unused when exact.
    seed: seed of those draws; unused when exact.

  Returns:
    The p-value in [min_attainable_p(n), 1]: exactly 1 when mean(x - y) is 0 up to float
    rounding (as in `paired_bootstrap_pvalue`), NaN for fewer than two pairs.
  """
  x, y = _paired(x, y)
  d = x - y
  n = len(d)
  if n < 2:
    return float('nan')
  observed = abs(d.sum())
  if observed <= n * _ZERO_TOL * max(np.abs(x).max(), np.abs(y).max(), 1e-300):
    return 1.0  # no difference beyond float rounding
  threshold = observed - _TIE_TOL * np.abs(d).sum()
  if n <= MAX_EXACT_PAIRS:
    extreme = 0
    for start in range(0, 2**n, _PATTERN_CHUNK):
      signs = _sign_patterns(start, min(start + _PATTERN_CHUNK, 2**n), n)
      extreme += np.count_nonzero(np.abs(signs @ d) >= threshold)
    return float(extreme / 2**n)
  if num_resamples < 1:
    raise ValueError(f'num_resamples={num_resamples!r} must be >= 1 for n={n} > {MAX_EXACT_PAIRS}')
  rng = np.random.default_rng(seed)
  extreme = 0
  for start in range(0, num_resamples, _PATTERN_CHUNK):
    size = min(_PATTERN_CHUNK, num_resamples - start)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(size, n))
    extreme += np.count_nonzero(np.abs(signs @ d) >= threshold)
  return float((1 + extreme) / (1 + num_resamples))


# ---------------------------------------------------------------------------------------------
# What a verdict needs: t-based intervals, multiplicity corrections, equivalence.
# ---------------------------------------------------------------------------------------------


def t_ci(d, *, level=0.95):
  """(mean, lo, hi): the mean of the paired differences ``d`` and its Student-t interval
  mean +- t_{n-1, (1+level)/2} sd / sqrt(n). On 8 values it is about 20% wider than the
  percentile bootstrap's, which under-covers at such n; NaNs for fewer than two values."""
  d = _as_1d(d, 'd')
  _check_level(level)
  if len(d) < 2:
    return (float(d.mean()) if len(d) else float('nan')), float('nan'), float('nan')
  mean, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
  half = float(scipy.stats.t.ppf(0.5 + level / 2, len(d) - 1)) * se
  return mean, mean - half, mean + half


def _finite(p):
  p = np.asarray(p, np.float64)
  return p, np.flatnonzero(np.isfinite(p))


def holm(pvalues):
  """Holm's step-down adjusted p-values (family-wise error control): the k-th smallest of the
  m finite p-values becomes max_{j <= k} min(1, (m - j + 1) p_(j)); NaN stays NaN."""
  p, idx = _finite(pvalues)
  out = np.full(p.shape, np.nan)
  order = idx[np.argsort(p[idx], kind='stable')]
  m = len(order)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out


def benjamini_hochberg(pvalues):
  """Benjamini-Hochberg q-values (false discovery rate over all claims): the k-th smallest of the
  m finite p-values becomes min_{j >= k} min(1, m p_(j) / j); NaN stays NaN."""
  p, idx = _finite(pvalues)
  out = np.full(p.shape, np.nan)
  order = idx[np.argsort(p[idx], kind='stable')]
  m = len(order)
  running = 1.0
  for rank in range(m - 1, -1, -1):
    i = order[rank]
    running = min(running, m * p[i] / (rank + 1))
    out[i] = running
  return out


def tost_pvalue(d, sesoi):
  """Two one-sided paired t-tests of equivalence (TOST, Schuirmann 1987): H0 |E d| >= sesoi.
  p = max(P(T >= (mean + sesoi) / se), P(T <= (mean - sesoi) / se)) with T ~ t_{n-1}; below 0.05
  the difference is within +-sesoi. NaN for fewer than two values."""
  d = _as_1d(d, 'd')
  if not sesoi > 0:
    raise ValueError(f'sesoi={sesoi!r} must be > 0')
  if len(d) < 2:
    return float('nan')
  mean, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
  if se == 0.0:  # every difference equal: equivalent iff inside the bounds
    return 0.0 if abs(mean) < sesoi else 1.0
  df = len(d) - 1
  p_lower = scipy.stats.t.sf((mean + sesoi) / se, df)
  p_upper = scipy.stats.t.cdf((mean - sesoi) / se, df)
  return float(max(p_lower, p_upper))
