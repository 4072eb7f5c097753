"""Tests of experiments/sweeps/bestlr.py: the grid brackets the shared rate a factor sqrt(2)
apart, every method runs every rate at the table1_confirm setting, the declared rule picks the
best score, breaks ties towards 1e-4 and asks for an extension at an edge."""
import math
import os

import pytest

from experiments import schedule
from experiments import sweeps as sweeps_lib
from experiments.sweeps import bestlr


def test_the_grid_is_geometric_around_the_shared_rate():
  rates = [bestlr.rate(k) for k in bestlr.GRID_STEPS]
  assert bestlr.SHARED_LR in rates and min(rates) == 5e-5 and rates == sorted(rates)
  for a, b in zip(rates, rates[1:]):
    assert b / a == pytest.approx(math.sqrt(2), rel=1e-2)
  assert bestlr.group_of(1.41e-4) == 'lr=1.41e-4' and bestlr.group_of(1e-4) == 'lr=1e-4'


def test_every_method_runs_every_rate_on_seeds_0_to_7():
  sweep = sweeps_lib.get_sweep('lr_grid')
  assert (sweep.first_seed, sweep.seeds) == (0, 8)
  cells = {(r.label, dict(r.overrides)['optim.learning_rate']) for r in sweep.runs}
  assert cells == {(m.label, bestlr.rate(k)) for m in bestlr.METHODS for k in bestlr.GRID_STEPS}
  # The confirmatory evaluation with common random numbers, the table1_confirm training.
  shared = dict(sweep.shared)
  assert shared['eval.problems'] == 500 and shared['eval.sampling.num_samples'] == 16
  assert shared['eval.batch_prompts'] == 16


def test_the_parts_cover_the_grid_once():
  names = [n for steps in ((0, 1), (-1, 2), (-2, 3)) for n in bestlr.part_runs(*steps).split(',')]
  assert sorted(names) == sorted(r.name for r in sweeps_lib.get_sweep('lr_grid').runs)
  specs = schedule.make_specs(sweeps_lib.get_sweep('lr_grid'), 8)
  assert len(specs) == 8 * len(bestlr.METHODS) * len(bestlr.GRID_STEPS)


def test_the_rule_picks_the_best_and_breaks_ties_towards_the_shared_rate():
  choose = bestlr.choose_rate
  assert choose({5e-5: 60.0, 1e-4: 62.0, 2e-4: 61.0}) == (1e-4, '')
  # 1.41e-4 and 7.07e-5 tie with 2e-4 within 0.1 points: the one nearest 1e-4 in log-rate;
  # 7.07e-5 and 1.41e-4 are equally near, so the lower.
  scores = {5e-5: 60.0, 7.07e-5: 63.0, 1e-4: 61.0, 1.41e-4: 63.0, 2e-4: 63.05, 2.83e-4: 59.0}
  assert choose(scores) == (7.07e-5, '')
  assert choose({5e-5: 60.0, 1e-4: 61.0, 2e-4: 62.0}) == (2e-4, 'above')
  assert choose({5e-5: 63.0, 1e-4: 61.0, 2e-4: 62.0}) == (5e-5, 'below')
  with pytest.raises(ValueError, match='at least one'):
    choose({})


def test_an_extension_runs_for_its_method_and_for_gspo(monkeypatch):
  monkeypatch.setattr(bestlr, 'EXTENSIONS', {'DFPO (Min-Replace)': (-3,)})
  assert bestlr.grid_steps('DFPO (Min-Replace)') == (-3,) + bestlr.GRID_STEPS
  assert bestlr.grid_steps('GSPO') == (-3,) + bestlr.GRID_STEPS
  assert bestlr.grid_steps('GRPO') == bestlr.GRID_STEPS
  sweep = sweeps_lib.get_sweep('lr_grid')
  assert {r.label for r in sweep.runs if r.group == bestlr.group_of(bestlr.rate(-3))
         } == {'GSPO', 'DFPO (Min-Replace)'}
  monkeypatch.setattr(bestlr, 'EXTENSIONS', {'GSPO': (4, 5, 6, 7)})
  with pytest.raises(ValueError, match='at most 3 per side'):
    bestlr.grid_steps('GSPO')
  monkeypatch.setattr(bestlr, 'EXTENSIONS', {'PPO': (4,)})
  with pytest.raises(ValueError, match="EXTENSIONS has 'PPO'; valid"):
    bestlr.grid_steps('GSPO')


def test_best_vs_best_is_blocked_until_every_rate_is_chosen(monkeypatch):
  """Fresh seeds 40-55; until lr_grid's rule has chosen every method's rate the sweep says why it
  cannot run and experiments.run refuses it; with the rates chosen each method runs at its own."""
  from experiments import run as run_lib  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(bestlr, 'CHOSEN_LR', {'GSPO': 1.41e-4})
  sweep = sweeps_lib.get_sweep('best_vs_best')
  assert (sweep.first_seed, sweep.seeds) == (40, 16) and 'needs CHOSEN_LR' in sweep.blocked
  with pytest.raises(SystemExit):
    run_lib.main(['best_vs_best'])
  chosen = {m.label: bestlr.rate(k) for m, k in zip(bestlr.METHODS, (1, 0, 0, -1))}
  monkeypatch.setattr(bestlr, 'CHOSEN_LR', chosen)
  sweep = sweeps_lib.get_sweep('best_vs_best')
  assert not sweep.blocked
  assert {r.label: dict(r.overrides)['optim.learning_rate'] for r in sweep.runs} == chosen


def _summary(label, lr, seed, avg):
  curve = {'step': [80], 'value': [avg]}
  return dict(label=label, seed=seed, overrides={'optim.learning_rate': lr},
              curves={'eval/avg@16': curve})


def test_rule_1_scores_every_rate_on_all_eight_seeds():
  """The score is the seed mean in points; a rate some seed has not run has no score, and the
  rule refuses to choose while any method misses a rate of its grid."""
  runs = [
      _summary(m.label, bestlr.rate(k), seed, 0.5 + 0.01 * seed - 0.02 * abs(k - i))
      for i, m in enumerate(bestlr.METHODS)
      for k in bestlr.GRID_STEPS
      for seed in range(8)
  ]
  scores = bestlr.scores_of(runs)
  assert scores['GSPO'][bestlr.rate(0)] == pytest.approx(100 * (0.5 + 0.035))
  chosen = bestlr.choose_rates(runs)
  # Method i peaks at grid step i: inside the grid for steps 0-2, at its upper edge for GRPO (3).
  assert chosen == {
      m.label: (bestlr.rate(i), 'above' if i == 3 else '') for i, m in enumerate(bestlr.METHODS)
  }
  with pytest.raises(ValueError, match=r"missing: \{'GRPO': \[5e-05\]\}"):
    bestlr.choose_rates([
        s for s in runs
        if (s['label'], s['seed'], s['overrides']['optim.learning_rate']) != ('GRPO', 3, 5e-5)
    ])


def test_chosen_rates_recompute_from_the_committed_grid():
  """CHOSEN_LR is the rule's choice on lr_grid's committed summaries, and is written only once
  every method has run every rate of its grid on seeds 0-7 (the rule needs them all)."""
  from experiments import common  # pylint: disable=import-outside-toplevel
  summaries = common.load_summaries(os.path.join(common.results_dir(), 'lr_grid'))
  if not bestlr.CHOSEN_LR:
    with pytest.raises(ValueError, match='missing'):
      bestlr.choose_rates(summaries)
    return
  chosen = bestlr.choose_rates(summaries)
  assert bestlr.CHOSEN_LR == {label: lr for label, (lr, _) in chosen.items()}
  for label, (_, edge) in chosen.items():  # an edge stays only after MAX_EXTENSIONS (rule 4)
    beyond = [k for k in bestlr.EXTENSIONS.get(label, ()) if (k > 0) == (edge == 'above')]
    assert not edge or len(beyond) == bestlr.MAX_EXTENSIONS, (label, edge)
