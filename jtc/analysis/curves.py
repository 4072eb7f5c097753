"""Statistics of logged training curves (numpy only, no model code).

  trailing_mean          the one smoothing of the project (plots, thresholds, experiments)
  jitter2                second-order difference jitter (paper Eq. 20)
  compute_at_threshold   compute spent when a curve first reaches a level (paper Table 2)
  normalise_to_baseline  values relative to a baseline run (Table 2 reports x GSPO)
  entropy_trend          least-squares slope of an entropy curve (Cor. 3.2's collapse trend)

Dimension key (docs/dimensions.md): none; a curve is a 1-D array, one value per logged step.
"""

import math

import numpy as np


def as_curve(curve, name='curve', min_len=1):
  """A finite float64 [n] array, or a ValueError naming the curve and what is wrong."""
  m = np.asarray(curve, np.float64).reshape(-1)
  if m.size < min_len:
    raise ValueError(f'{name} has {m.size} points; needs at least {min_len}')
  if not np.all(np.isfinite(m)):
    raise ValueError(f'{name} has non-finite values at indices {np.nonzero(~np.isfinite(m))[0]}')
  return m


def trailing_mean(curve, window):
  """[n]: the mean of the last ``window`` points up to each point (fewer at the start)."""
  if not isinstance(window, int) or window < 1:
    raise ValueError(f'window={window!r} must be a positive int')
  m = np.asarray(curve, np.float64).reshape(-1)
  csum = np.cumsum(np.insert(m, 0, 0.0))
  lo = np.maximum(np.arange(1, m.size + 1) - window, 0)
  return (csum[1:] - csum[lo]) / (np.arange(1, m.size + 1) - lo)


def jitter2(curve):
  """Jitter2(m) = 1/(n-2) sum_{t=1}^{n-2} |m_{t+2} - 2 m_{t+1} + m_t| (paper Eq. 20)."""
  m = as_curve(curve, min_len=3)
  return float(np.mean(np.abs(m[2:] - 2.0 * m[1:-1] + m[:-2])))


def compute_at_threshold(curve, compute, threshold, *, smooth=1, interpolate=False):
  """Compute spent when ``curve`` first reaches ``threshold`` (paper Table 2, Prediction 1).

  Args:
    curve: [n] logged metric (e.g. training reward), in logging order.
    compute: [n] cumulative compute at each point (steps, generated tokens, FLOPs...).
    threshold: the level to reach (curve >= threshold).
    smooth: `trailing_mean` window applied to the curve first (1 = raw).
    interpolate: linearly interpolate the compute between the last point below and the first
      point at or above the threshold (else: the compute of that first point).
  Returns:
    float compute, or math.inf if the threshold is never reached.
  """
  m, c = as_curve(curve), as_curve(compute, 'compute')
  if m.shape != c.shape:
    raise ValueError(f'curve and compute lengths differ: {m.size} != {c.size}')
  if not isinstance(smooth, int) or smooth < 1:
    raise ValueError(f'smooth={smooth!r} must be a positive int')
  if smooth > 1:
    m = trailing_mean(m, smooth)
  hit = np.nonzero(m >= threshold)[0]
  if hit.size == 0:
    return math.inf
  i = int(hit[0])
  if not interpolate or i == 0:
    return float(c[i])
  frac = (threshold - m[i - 1]) / (m[i] - m[i - 1])
  return float(c[i - 1] + frac * (c[i] - c[i - 1]))


def normalise_to_baseline(values, baseline):
  """{run: value / values[baseline]} (Table 2 reports Compute@Reward relative to GSPO)."""
  if baseline not in values:
    raise ValueError(f'baseline {baseline!r} is not one of the runs {sorted(values)}')
  base = values[baseline]
  if not base or not math.isfinite(base):
    raise ValueError(f'baseline {baseline!r} value {base!r} must be finite and non-zero')
  return {k: v / base for k, v in values.items()}


def entropy_trend(curve, steps=None):
  """Entropy-collapse trend: the least-squares line through (step, entropy).

  Returns dict(slope per step, intercept, rel_slope = slope / mean entropy (fraction of the
  level lost per step; negative = collapsing), r2). steps defaults to 0..n-1.
  """
  m = as_curve(curve, min_len=2)
  x = np.arange(m.size, dtype=np.float64) if steps is None else as_curve(steps, 'steps')
  if x.shape != m.shape:
    raise ValueError(f'steps and curve lengths differ: {x.size} != {m.size}')
  if np.ptp(x) == 0:
    raise ValueError('steps must not all be equal')
  slope, intercept = np.polyfit(x, m, 1)
  resid = m - (slope * x + intercept)
  ss = np.sum((m - m.mean())**2)
  return {
      'slope': float(slope),
      'intercept': float(intercept),
      'rel_slope': float(slope / m.mean()) if m.mean() != 0 else float('nan'),
      'r2': float(1.0 - np.sum(resid**2) / ss) if ss > 0 else 1.0
  }
