"""Best-vs-best (issue 54): each method at its own best learning rate, not at one shared rate.

Every verdict so far compared the methods at one shared peak rate, 1e-4, the best of the coarse
grid 5e-5 / 1e-4 / 2e-4 in `table1`. The audit of issue 54 found GSPO under-tuned there: GSPO at
1.375x that rate (stepsize_confirm) is +0.92 points above GSPO at 1e-4 (p = 0.004), so "DFPO
ahead of GSPO" holds at one rate, and whether it holds with each method at its own best rate was
never asked.

  python -m experiments.run lr_grid        # exploratory, seeds 0-7: chooses each method's rate

It runs in three parts of two rates each (`part_runs`), so that a population holds 16 members
(a method's 6 rates x 8 seeds in one program would hold 48, about 3.5 GiB on the CPU machine):
  python -m experiments.run lr_grid --jobs 2 --runs "$(python -c 'from experiments.sweeps import bestlr; print(bestlr.part_runs(0, 1))')"
and likewise (-1, 2) and (-2, 3).

`lr_grid` runs GSPO, literal DFPO (Min-Replace, Eq. 68), gated DFPO (GSPO's clip gate kept) and
GRPO on a grid of peak rates a factor sqrt(2) apart around the shared 1e-4 (5e-5 to 2.83e-4),
at the table1_confirm setting otherwise (80 RL steps of 16 prompts x G = 8 in 2 mini-batches)
and with the confirmatory evaluation (avg@16 on all 500 held-out problems, the same draws for
every run of a seed: `EVAL_CRN`), so that the choice is made with the precision the
confirmation will judge with.

THE RULE that chooses each method's rate, written here before any run of `lr_grid`
(`choose_rate` implements it; tests/experiments/sweeps/test_bestlr.py checks it):
  1. Score of a rate = the mean over seeds 0-7 of the final held-out avg@16 (`FINAL_AVG`) of the
     method at that rate. Nothing else enters (no training reward, no curve, no other method).
  2. The chosen rate is the rate with the highest score.
  3. Ties: rates whose score is within `TIE_POINTS` (0.1 points, the precision the tables print)
     of the highest are tied; among them the one nearest the shared rate 1e-4 in log-rate wins
     (the lower if two are equally near), so that a tie never moves a method away from the rate
     of the earlier verdicts.
  4. Edge of the grid: if the chosen rate is the lowest or the highest rate the method ran, the
     grid is not bracketing its best. Then the method's grid is extended by one step of sqrt(2)
     beyond that edge (`EXTENSIONS`: 3.54e-5, 2.5e-5, ... below; 4e-4, 5.66e-4, ... above),
     the new rate runs on the same seeds 0-7 for that method and for GSPO if GSPO has not run it
     (every table compares a method with GSPO at the same rate; GSPO's own choice then counts
     that rate too, rule 1 over every rate it ran), and the rule is applied again from 1; at
     most `MAX_EXTENSIONS` steps per side, after which the edge rate is chosen and the results
     file says the grid did not bracket it.
  5. Each method is chosen on its own; the chosen rates are written into `CHOSEN_LR` (with the
     scores that chose them) before any run of the confirmatory `best_vs_best` sweep, which
     runs on fresh seeds (`CONFIRM_FIRST_SEED`..) that no run used to choose a setting.
"""

import dataclasses
import math

from experiments import common
from experiments.sweeps import confirm
from experiments.sweeps.base import (DFPO_GATED, DFPO_MIN, EVAL_CRN, FINAL_AVG, GRPO, GSPO, Table,
                                     at, make_sweep, num_steps_of, shared_overrides)

METHODS = (GSPO, DFPO_MIN, DFPO_GATED, GRPO)
SHARED_LR = 1e-4  # the rate of every earlier verdict
STEP = math.sqrt(2.0)  # the grid's spacing in rate
GRID_STEPS = (-2, -1, 0, 1, 2, 3)  # rate = SHARED_LR * STEP ** k: 5e-5 .. 2.83e-4
MAX_EXTENSIONS = 3  # per side (rule 4)
TIE_POINTS = 0.1  # rule 3, points of avg@16
# Rule 4's extensions as they happen, per method label: {'GSPO': (4,)} adds SHARED_LR * STEP ** 4.
# Each entry is added only after the grid's results show that method's best at an edge.
EXTENSIONS = {}
# Rule 5: {method label: rate}, written from lr_grid's results before any run of best_vs_best.
# Chosen 2026-12-03 by `choose_rates` on lr_grid's committed summaries (its scores:
# experiments/results/lr_grid.notes.md); a test checks that the two agree.
CHOSEN_LR = {
    'GSPO': 1.41e-4,
    'DFPO (Min-Replace)': 1e-4,
    'DFPO (Min-Replace, gated)': 1.41e-4,
    'GRPO': 1.41e-4
}
# Seeds 0-7 choose; 8-23 (table1_confirm and the other *_confirm sweeps) and 24-39
# (stepsize_confirm) are used; 40-55 are fresh for the best-vs-best confirmation.
CONFIRM_FIRST_SEED = 40


def rate(k):
  """The grid's k-th rate, SHARED_LR * sqrt(2) ** k, rounded to 3 significant digits."""
  return float(f'{SHARED_LR * STEP ** k:.3g}')


def grid_steps(label):
  """The steps k a method runs: the grid and that method's extensions (rule 4); GSPO, the
  tables' baseline, also runs every other method's."""
  extra = EXTENSIONS.get(label, ())
  for other, steps in EXTENSIONS.items():
    if other not in {m.label for m in METHODS}:
      raise ValueError(f'EXTENSIONS has {other!r}; valid: {[m.label for m in METHODS]}')
    if label == GSPO.label:
      extra = tuple(extra) + tuple(steps)
  extra = tuple(sorted(set(extra)))
  below = [k for k in extra if k < min(GRID_STEPS)]
  above = [k for k in extra if k > max(GRID_STEPS)]
  if len(below) > MAX_EXTENSIONS or len(above) > MAX_EXTENSIONS:
    raise ValueError(f'EXTENSIONS[{label!r}] = {extra}: at most {MAX_EXTENSIONS} per side')
  if set(extra) & set(GRID_STEPS):
    raise ValueError(f'EXTENSIONS[{label!r}] = {extra} repeats a step of the grid {GRID_STEPS}')
  return tuple(sorted(set(GRID_STEPS) | set(extra)))


def group_of(lr):
  """'lr=1e-4', 'lr=1.41e-4': the rate with at most 3 significant digits."""
  mantissa, exponent = f'{lr:.2e}'.split('e')
  return f'lr={mantissa.rstrip("0").rstrip(".")}e{int(exponent)}'


def scores_of(summaries, seeds=range(8)):
  """Rule 1 on lr_grid's ``summaries``: {method label: {rate: mean over ``seeds`` of the final
  held-out avg@16, in points}}, over the rates every one of ``seeds`` has run."""
  by_rate = {}
  for s in summaries:
    if s['seed'] in seeds:
      points = 100.0 * common.metric_value(s, FINAL_AVG)
      lr = s['overrides']['optim.learning_rate']
      by_rate.setdefault(s['label'], {}).setdefault(lr, {})[s['seed']] = points
  return {
      label: {
          lr: sum(v.values()) / len(v) for lr, v in rates.items() if set(v) == set(seeds)
      } for label, rates in by_rate.items()
  }


def choose_rate(scores, *, tie_points=TIE_POINTS, shared=SHARED_LR):
  """Rules 2-4 on ``scores`` ({rate: mean final avg@16 in points} of one method over the rates
  it ran). Returns (chosen rate, 'below' | 'above' | ''): the side to extend the grid on when
  the chosen rate is at an edge of the rates run, '' when it is bracketed."""
  if not scores:
    raise ValueError('choose_rate needs the score of at least one rate')
  best = max(scores.values())
  tied = [lr for lr, s in scores.items() if s >= best - tie_points - 1e-12]
  # Distance in grid steps, to 1 decimal: the rounded rates 7.07e-5 and 1.41e-4 are equally near.
  chosen = min(tied, key=lambda lr: (round(abs(math.log(lr / shared) / math.log(STEP)), 1), lr))
  edge = 'below' if chosen == min(scores) else 'above' if chosen == max(scores) else ''
  return chosen, edge


def choose_rates(summaries):
  """Rules 1-4 for every method on lr_grid's ``summaries``: {method label: (chosen rate, edge)}
  (`choose_rate`); a ValueError names the rates a method has not yet run on all of seeds 0-7."""
  scores = scores_of(summaries)
  missing = {
      m.label: [rate(k) for k in grid_steps(m.label) if rate(k) not in scores.get(m.label, {})]
      for m in METHODS
  }
  if any(missing.values()):
    raise ValueError('lr_grid has not run every rate on seeds 0-7; missing: '
                     f'{ {label: lrs for label, lrs in missing.items() if lrs} }')
  return {m.label: choose_rate(scores[m.label]) for m in METHODS}


def grid_runs(smoke):
  methods = METHODS[:1] if smoke else METHODS
  runs = []
  for m in methods:
    steps = (0,) if smoke else grid_steps(m.label)
    runs += [
        dataclasses.replace(at(m, group_of(rate(k)), ('optim.learning_rate', rate(k))),
                            name=f'{m.name}_k{k}') for k in steps
    ]
  return tuple(runs)


def part_runs(*steps):
  """The `--runs` value of the part that runs grid steps ``steps`` for every method."""
  return ','.join(r.name for r in grid_runs(False) if int(r.name.rpartition('_k')[2]) in steps)


def lr_grid(smoke=False):
  n = num_steps_of(smoke)
  return make_sweep(
      'lr_grid', smoke, runs=grid_runs(smoke), baseline='GSPO',
      shared=shared_overrides(n, *(() if smoke else confirm.EVAL), *EVAL_CRN, diagnostics_every=0),
      description=('Exploratory (seeds 0-7): GSPO, literal and gated DFPO (Min-Replace) and GRPO '
                   'at peak learning rates 5e-5 to 2.83e-4 a factor sqrt(2) apart, avg@16 on 500 '
                   'held-out problems; chooses each method\'s rate for best_vs_best by the rule '
                   'of experiments/sweeps/bestlr.py.'),
      curve_keys=('accuracy', 'reward_mean', 'update_norm', 'frac_traj_gated', 'entropy'),
      tables=(Table(
          'Held-out accuracy by learning rate (each method against GSPO at the same '
          'rate)', FINAL_AVG, unit='(%)', scale=100.0, by_group=True),
              Table('Update norm ||Delta theta||, mean over training', 'mean:update_norm',
                    by_group=True, digits=5),
              Table('Trajectories whose gradient is switched off, mean over training',
                    'mean:frac_traj_gated', by_group=True)))


BEST_PREDICTION = (
    'paper Table 1 (AIME25 avg@32, Qwen3-32B): DFPO (Min-Replace) above GSPO, asked here with '
    'each method at its own best learning rate (chosen on seeds 0-7 by lr_grid\'s rule) rather '
    'than at one shared rate: literal DFPO - GSPO > 0 and gated DFPO - GSPO > 0.')


def best_vs_best(smoke=False):
  """Each method at its own chosen rate (`CHOSEN_LR`, from lr_grid) on fresh seeds 40-55, avg@16
  on 500 problems; `Sweep.blocked` (experiments.run refuses to run it) until every method's rate
  has been chosen, its runs meanwhile at the shared rate as placeholders."""
  methods = METHODS[:2] if smoke else METHODS
  missing = [m.label for m in methods if m.label not in CHOSEN_LR and not smoke]
  blocked = (f'best_vs_best needs CHOSEN_LR for {missing} (chosen by lr_grid on seeds 0-7 by the '
             f'rule of experiments/sweeps/bestlr.py); it has {sorted(CHOSEN_LR)}'
             if missing else '')
  runs = tuple(
      at(m, 'best', ('optim.learning_rate',
                     SHARED_LR if smoke else CHOSEN_LR.get(m.label, SHARED_LR))) for m in methods)
  n = num_steps_of(smoke)
  return make_sweep(
      'best_vs_best', smoke, runs=runs, baseline='GSPO',
      shared=shared_overrides(n, *(() if smoke else confirm.EVAL), *(() if smoke else EVAL_CRN),
                              diagnostics_every=0), seeds=1 if smoke else confirm.SEEDS,
      first_seed=0 if smoke else CONFIRM_FIRST_SEED, blocked=blocked,
      description=('Confirmatory best-vs-best (fresh seeds 40-55): GSPO, literal and gated DFPO '
                   'and GRPO, each at its own peak learning rate chosen by lr_grid on seeds 0-7, '
                   'avg@16 on 500 held-out problems.'),
      curve_keys=('accuracy', 'reward_mean', 'update_norm', 'frac_traj_gated'),
      tables=(Table('Held-out accuracy, each method at its own rate, vs GSPO at its own', FINAL_AVG,
                    unit='(%)', scale=100.0, by_group=True, prediction=BEST_PREDICTION),
              Table('Update norm ||Delta theta||, mean over training', 'mean:update_norm',
                    by_group=True, digits=5)))


SWEEPS = {'lr_grid': lr_grid, 'best_vs_best': best_vs_best}
