"""Statistics over seeds: percentile-bootstrap confidence intervals and paired bootstrap tests.

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
  * Fewer than two values (or pairs) give NaN intervals and p-values: one seed says nothing
    about the spread.
"""

import numpy as np

DEFAULT_RESAMPLES = 10_000
_ZERO_TOL = 1e-12     # |mean(x - y)| below this x max|x|, |y| counts as exactly 0


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


def paired_bootstrap_ci(x, y, *, level=0.95, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """(mean, lo, hi) of the paired differences x - y (same-seed pairs)."""
  x, y = _paired(x, y)
  return bootstrap_ci(x - y, level=level, num_resamples=num_resamples, seed=seed)


def paired_bootstrap_pvalue(x, y, *, num_resamples=DEFAULT_RESAMPLES, seed=0):
  """Two-sided paired bootstrap p-value of H0: E[x - y] = 0 (see the module docstring)."""
  x, y = _paired(x, y)
  d = x - y
  if len(d) < 2:
    return float('nan')
  observed = abs(d.mean())
  if observed <= _ZERO_TOL * max(np.abs(x).max(), np.abs(y).max(), 1e-300):
    return 1.0                                 # no difference beyond float rounding
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
