"""Tests of experiments/sweeps/lag.py: k in {0, 1, 2, 4} x {GSPO, literal DFPO, gated DFPO}, every
arm at the same rate and the same shared settings, exploratory seeds 0-7."""
from experiments import sweeps as sweeps_lib
from experiments.sweeps import lag


def test_every_method_at_every_lag():
  sweep = sweeps_lib.get_sweep('policy_lag')
  assert (sweep.first_seed, sweep.seeds) == (0, 8)
  cells = {(r.group, r.label) for r in sweep.runs}
  labels = {r.label for r in sweep.runs}
  assert len(labels) == 3 and 'GSPO' in labels
  assert cells == {(f'lag={k}', label) for k in lag.LAGS for label in labels}
  for r in sweep.runs:
    o = dict(r.overrides)
    assert o['rollout.policy_lag'] == int(r.group.split('=')[1])
    assert o['optim.learning_rate'] == 1e-4


def test_the_smoke_form_keeps_a_lag():
  smoke = sweeps_lib.get_sweep('policy_lag', smoke=True)
  assert {dict(r.overrides)['rollout.policy_lag'] for r in smoke.runs} == {0, 2}
