"""Tests of experiments/sweeps/confirm.py: the confirmatory sweeps run the settings fixed from the
exploratory ones (lr 1e-4, avg@16 on 500 problems) on 16 fresh seeds 8-23, and their smoke forms
are the exploratory sweeps' (seed 0, the small evaluation), so smoke runs are shared."""
import pytest

from experiments import sweeps as sweeps_lib
from experiments.sweeps import confirm

CONFIRM = ('table1_confirm', 'offpolicy_confirm', 'table4_confirm', 'delta_confirm')


@pytest.mark.parametrize('name', CONFIRM)
def test_fresh_seeds_and_the_fixed_evaluation(name):
  sweep = sweeps_lib.get_sweep(name)
  assert (sweep.first_seed, sweep.seeds) == (8, 16)
  shared = dict(sweep.shared)
  assert shared['eval.problems'] == 500 and shared['eval.sampling.num_samples'] == 16
  if name != 'delta_confirm':  # DelTA and DAPO keep the delta sweep's settings
    assert all(dict(r.overrides).get('optim.learning_rate') == 1e-4 for r in sweep.runs)


@pytest.mark.parametrize('name', CONFIRM)
def test_the_smoke_form_is_the_exploratory_one(name):
  smoke = sweeps_lib.get_sweep(name, smoke=True)
  assert (smoke.first_seed, smoke.seeds, smoke.config_arg) == (0, 1, 'smoke')
  assert 'eval.problems' not in dict(smoke.shared)
  assert confirm.LR == ('optim.learning_rate', 1e-4)
