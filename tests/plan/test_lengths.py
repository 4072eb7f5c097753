"""Tests of jtc.plan.lengths: the log-normal has the mean and p99 asked for; E[max of n lengths]
and the continuous scheduler's decode steps agree with simulations of the schedulers (an
independent reference); lengths at the budget give the closed forms; bad --lengths name it."""
import heapq
import json

import numpy as np
import pytest

from jtc.plan import lengths as lengths_lib

T = 512


def _draw(lengths, n, rng):
  """n lengths drawn from ``lengths`` (inverse CDF on 1..T)."""
  u = rng.random(n)
  return np.minimum(np.searchsorted(lengths.cdf_T, u, side='right'), lengths.T)


def _continuous_steps(lengths_R, slots):
  """Decode steps of a call whose rows (in order) take the next free slot: list scheduling."""
  free = [0] * slots
  end = 0
  for n in lengths_R:
    start = heapq.heappop(free)
    heapq.heappush(free, start + n)
    end = max(end, start + n)
  return end


def test_lognormal_has_the_mean_and_p99_asked_for():
  d = lengths_lib.lognormal(60.0, 240.0, T)
  assert d.mean() == pytest.approx(60.0, rel=0.02)  # ceil adds < 1 token; the cap removes little
  assert int(np.searchsorted(d.cdf_T, 0.99)) == pytest.approx(240, abs=2)
  assert np.all(np.diff(d.cdf_T) >= 0) and d.cdf_T[0] == 0


@pytest.mark.parametrize('rows,slots', [(64, 64), (64, 16), (128, 8)])
def test_decode_steps_agree_with_simulated_schedulers(rows, slots):
  d = lengths_lib.lognormal(60.0, 240.0, T)
  rng = np.random.default_rng(0)
  calls = [_draw(d, rows, rng) for _ in range(400)]
  static = np.mean([c.max() for c in calls])
  assert lengths_lib.decode_steps(d, rows) == pytest.approx(static, rel=0.03)
  continuous = np.mean([_continuous_steps(c, slots) for c in calls])
  assert lengths_lib.decode_steps(d, rows, slots) == pytest.approx(continuous, rel=0.08)


def test_rows_at_the_budget_give_whole_waves():
  """Every row decodes T tokens: static T steps; continuous with R / 4 slots, four waves."""
  d = lengths_lib.Lengths(np.zeros(T), 'all at T')
  assert lengths_lib.decode_steps(d, 64) == T
  assert lengths_lib.decode_steps(d, 64, 16) == 4 * T
  lines = lengths_lib.estimate_lines(d, rows=64, slots=16, seconds_per_call=2.0, calls=3,
                                     compiled='static')
  assert ' 6 s of sampling' in lines[1] and ' 24 s of sampling' in lines[2]


def test_a_run_s_metrics_give_its_lengths(tmp_path):
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    for step, (mean, p99) in enumerate([(50, 200), (70, 280)]):
      f.write(json.dumps(dict(step=step, response_length=mean, response_length_p99=p99)) + '\n')
  d = lengths_lib.parse(str(tmp_path), T)
  assert d.mean() == pytest.approx(60.0, rel=0.02) and '2 steps' in d.source


@pytest.mark.parametrize('text,needle', [('60', 'no such run'), ('240,60', 'mean <= p99'),
                                         ('a,b', 'MEAN,P99'), ('10,1000', 'beyond')])
def test_bad_lengths_name_the_flag(text, needle):
  with pytest.raises(ValueError, match=needle) as e:
    lengths_lib.parse(text, T)
  assert '--lengths' in str(e.value)


def test_a_plans_estimate_runs_the_slots_the_plan_resolved():
  """`plan_lines` reads the plan's `Decoding`: its rows, its (memory-derived) slot count for the
  continuous scheduler even when the compiled one is static."""
  import types  # pylint: disable=import-outside-toplevel
  from jtc.rl import decoding  # pylint: disable=import-outside-toplevel
  d = decoding.Decoding(scheduler='static', rows=64, slots=16, slots_from='default', layout='fsdp',
                        layout_why='configured', free_bytes=1)
  row = types.SimpleNamespace(stage='sample', seconds=2.0, calls=3)
  lines = lengths_lib.plan_lines(types.SimpleNamespace(rows=[row], decoding=d),
                                 lengths_lib.Lengths(np.zeros(T), 'all at T'))
  assert 'compiled static stage' in lines[0]
  assert 'continuous, 16 slots' in lines[2] and ' 24 s of sampling' in lines[2]
