"""Tests of experiments/sweeps/base.py: the num_steps knob resizes a sweep, a run placed in a
group keeps its own overrides before the group's, the learning-rate grid, the predicted signs,
the machine-time estimate, and a claim's SESOI validated when it is declared."""
import pytest

from experiments import schedule
from experiments import sweeps as sweeps_lib
from experiments.sweeps import base


def test_num_steps_knob_resizes_the_sweep():
  sweep = sweeps_lib.get_sweep('table1', num_steps=7)
  specs = schedule.make_specs(sweep, 2)
  assert all(dict(s.overrides)['num_steps'] == 7 for s in specs)
  assert len({s.run_id for s in specs}) == 2 * len(sweep.runs)
  assert specs[0].key != schedule.make_specs(sweeps_lib.get_sweep('table1'), 1)[0].key


def test_a_run_in_a_group_keeps_its_overrides_first():
  run = base.at(base.DFPO_GATED, 'lr=1e-4', ('optim.learning_rate', 1e-4))
  assert run.name == 'dfpo_min_replace_gated_learning_rate0.0001' and run.group == 'lr=1e-4'
  assert run.overrides == base.GATED + (('optim.learning_rate', 1e-4),)
  assert base.at(base.GSPO, '') == base.GSPO


def test_the_learning_rate_grid_and_its_smoke_form():
  full = base.lr_runs((base.GSPO, base.GRPO), smoke=False)
  assert [r.group for r in full] == ['lr=5e-5'] * 2 + ['lr=1e-4'] * 2 + ['lr=2e-4'] * 2
  assert {r.group for r in base.lr_runs((base.GSPO,), smoke=True)} == {'lr=1e-4'}
  assert base.predicted(full, (base.GRPO.label,), '>') == tuple(
      ((g, 'GRPO'), '>') for g in ('lr=5e-5', 'lr=1e-4', 'lr=2e-4'))


def test_the_estimate_is_linear_in_runs_seeds_and_steps():
  sweep = sweeps_lib.get_sweep('table1')
  one = base.estimate_seconds(sweep, seeds=1)
  assert base.estimate_seconds(sweep, seeds=3) == pytest.approx(3 * one)
  per_run = one / len(sweep.runs)
  assert per_run == pytest.approx(base.STARTUP_SECONDS + sweep.num_steps * base.STEP_SECONDS +
                                  2 * base.EVAL_SECONDS)


def test_a_claim_without_a_positive_sesoi_is_refused():
  with pytest.raises(ValueError, match='sesoi=0.0 must be > 0'):
    base.Claim('c', family='f', sweep='table1', metric=base.FINAL_AVG, arm='GSPO', baseline='GRPO',
               sesoi=0.0)
