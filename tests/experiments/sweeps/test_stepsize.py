"""Tests of experiments/sweeps/stepsize.py: the step-matched arms are the base pair at the rates
the factors (chosen on seeds 0-7) say, and the confirmatory form runs them on fresh seeds 24-39,
which no other sweep uses."""
import pytest

from experiments import sweeps as sweeps_lib
from experiments.sweeps import stepsize


def _lr(run):
  return dict(run.overrides)['optim.learning_rate']


def test_matched_arms_are_the_base_pair_at_the_declared_factors():
  gspo, dfpo = stepsize.base_runs()
  raised, lowered, coef_mass = stepsize.matched_runs()
  assert (raised.config, lowered.config, coef_mass.config) == (gspo.config, dfpo.config,
                                                               gspo.config)
  assert _lr(raised) == pytest.approx(_lr(gspo) * stepsize.RAISE_GSPO)
  assert _lr(lowered) == pytest.approx(_lr(dfpo) / stepsize.LOWER_DFPO)
  assert _lr(coef_mass) == pytest.approx(_lr(gspo) * stepsize.COEF_MASS_RATIO)
  strip = lambda r: [kv for kv in r.overrides if kv[0] != 'optim.learning_rate']
  assert strip(raised) == strip(gspo) and strip(lowered) == strip(dfpo)


def test_the_confirmatory_seeds_are_fresh():
  confirm = sweeps_lib.get_sweep('stepsize_confirm')
  explore = sweeps_lib.get_sweep('stepsize')
  assert (confirm.first_seed, confirm.seeds) == (24, 16) and explore.first_seed == 0
  assert [r.name for r in confirm.runs] == [r.name for r in explore.runs]
  used = {
      s for name in sweeps_lib.SWEEPS if name != 'stepsize_confirm'
      for sweep in [sweeps_lib.get_sweep(name)]
      for s in range(sweep.first_seed, sweep.first_seed + sweep.seeds)
  }
  assert not used & set(range(24, 40))
  assert all(s < 100 for s in range(confirm.first_seed, confirm.first_seed + confirm.seeds))
