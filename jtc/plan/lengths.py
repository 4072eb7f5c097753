"""Length-aware sampler estimates (`jtc plan --lengths`): how many decode steps a sampler call
takes when answers end before the token budget, under the `static` and `continuous` schedulers
(`jtc.models.decode_loop`).

The sample stage of a plan is compiled with its loop at T = max_new_tokens decode steps per call
(every row decodes the whole budget). Real answers are long-tailed: with lengths L (capped at T)
drawn independently for the R rows of a call,

  static      runs every row until the longest has ended: E[max of R lengths] steps;
  continuous  s slots refilled as rows end: the R - s rows beyond the first s start as slots free
              up, about (R - s) E[L] / s steps, and the last s rows in flight end about
              E[max of s lengths] later: (R - s) E[L] / s + E[max of s] steps (exactly the
              static count at s = R; list-scheduling simulations agree within about 5%,
              tests/plan/test_lengths.py).

E[max of n] = sum_{t=0}^{T-1} (1 - F(t)^n) for the lengths' distribution function F.

The lengths come from `--lengths MEAN,P99` (a log-normal with that mean and 99th percentile,
capped at T) or from a previous run (`--lengths WORKDIR` or its metrics.jsonl: the mean over its
logged steps of `response_length` and `response_length_p99`). The estimate scales the compiled
sample stage's time per decode step (its time per call / T) by the steps of each scheduler;
that step runs the compiled scheduler's rows, so for the other scheduler it is the same-cost
approximation (a decode step bound by reading the weights), and it leaves out the prefill.

Dimension key (docs/dimensions.md): R rows of a sampler call, T max new tokens.
"""

import dataclasses
import json
import math
import os

import numpy as np

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclasses.dataclass(frozen=True)
class Lengths:
  """A length distribution on 1..T: ``cdf_T[t]`` = P(L <= t) for t = 0..T-1 (P(L <= T) = 1)."""
  cdf_T: np.ndarray
  source: str

  @property
  def T(self) -> int:
    return len(self.cdf_T)

  def mean(self) -> float:
    return float(np.sum(1.0 - self.cdf_T))

  def expected_max(self, n: int) -> float:
    """E[max of n independent lengths]."""
    return float(np.sum(1.0 - self.cdf_T**n))


def lognormal(mean: float, p99: float, T: int, source: str = '') -> Lengths:
  """Lengths ceil(X) capped at T, X log-normal with the given mean and 99th percentile."""
  if not 0 < mean <= p99:
    raise ValueError(f'--lengths: mean {mean} and p99 {p99} need 0 < mean <= p99')
  gap = math.log(p99 / mean)  # = Z99 s - s^2 / 2 for the log's deviation s
  if 2 * gap > Z99**2:
    raise ValueError(f'--lengths: p99 / mean = {p99 / mean:.1f} is beyond a log-normal\'s '
                     f'{math.exp(Z99**2 / 2):.1f}')
  s = Z99 - math.sqrt(Z99**2 - 2 * gap)
  mu = math.log(mean) - s * s / 2
  t = np.arange(T, dtype=np.float64)
  with np.errstate(divide='ignore'):
    z = (np.log(t) - mu) / max(s, 1e-12)
  cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
  return Lengths(np.where(t > 0, cdf, 0.0), source or f'log-normal, mean {mean:g}, p99 {p99:g}')


def from_run(path: str, T: int) -> Lengths:
  """The log-normal of a previous run's lengths: the mean over its logged steps of
  `response_length` and `response_length_p99` (``path``: its workdir or metrics.jsonl)."""
  file = os.path.join(path, 'metrics.jsonl') if os.path.isdir(path) else path
  if not os.path.isfile(file):
    raise ValueError(f'--lengths={path!r}: no such run (a workdir, its metrics.jsonl, or MEAN,P99)')
  with open(file) as f:
    records = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in records if 'response_length' in r and 'response_length_p99' in r]
  if not rows:
    raise ValueError(f'--lengths={path!r}: no step logs response_length and response_length_p99')
  mean = float(np.mean([r['response_length'] for r in rows]))
  p99 = float(np.mean([r['response_length_p99'] for r in rows]))
  return lognormal(mean, max(p99, mean), T, f'{file}: {len(rows)} steps, mean {mean:.1f}, '
                   f'p99 {p99:.1f}')


def parse(text: str, T: int) -> Lengths:
  """`--lengths`: 'MEAN,P99' or a previous run's workdir / metrics.jsonl."""
  parts = text.split(',')
  if len(parts) == 2 and not os.path.exists(text):
    try:
      mean, p99 = float(parts[0]), float(parts[1])
    except ValueError:
      raise ValueError(f'--lengths={text!r}: MEAN,P99 (two numbers) or a run\'s workdir') from None
    return lognormal(mean, p99, T)
  return from_run(text, T)


def decode_steps(lengths: Lengths, rows: int, slots: int | None = None) -> float:
  """Expected decode steps of a call of ``rows`` rows: static (``slots`` None) or continuous."""
  if slots is None or slots >= rows:
    return lengths.expected_max(rows)
  return (rows - slots) * lengths.mean() / slots + lengths.expected_max(slots)


def estimate_lines(lengths: Lengths, *, rows: int, slots: int | None, seconds_per_call: float,
                   calls: float, compiled: str) -> list:
  """The lines `jtc plan` prints: decode steps per call and sampler seconds per RL step of each
  scheduler, from the compiled stage's ``seconds_per_call`` at T steps (``compiled``: its
  scheduler)."""
  T = lengths.T
  per_step = seconds_per_call / T
  S = slots or rows
  lines = [
      f'sampler, length-aware ({lengths.source}; mean {lengths.mean():.0f} of T={T}): the table '
      f'assumes T decode steps per call; per step {per_step * 1e3:.3g} ms (the compiled '
      f'{compiled} stage), prefill left out'
  ]
  for name, steps in (('static', decode_steps(lengths, rows)), (f'continuous, {S} slots',
                                                                decode_steps(lengths, rows, S))):
    lines.append(f'  {name:24s} {steps:8.0f} decode steps per call of {rows} rows -> '
                 f'{calls * steps * per_step:9.4g} s of sampling per RL step '
                 f'(at T: {calls * seconds_per_call:.4g} s)')
  return lines


def plan_lines(result, lengths: Lengths) -> list:
  """`estimate_lines` for plan ``result`` (its compiled 'sample' stage), the
  continuous scheduler at the slot count the plan resolved (`Plan.decoding`: the configured
  or memory-derived one, as the trainer's sampler takes it)."""
  row = next((r for r in result.rows if r.stage == 'sample'), None)
  if row is None:
    return ['sampler, length-aware: no sample stage compiled (--stages)']
  d = result.decoding
  return estimate_lines(lengths, rows=d.rows, slots=d.slots, seconds_per_call=row.seconds,
                        calls=row.calls, compiled=d.scheduler)
