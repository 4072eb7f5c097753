"""Tests of experiments/sweeps/mismatch.py: GSPO and DFPO in every (sampler, correction) group,
the corrections only where a mismatch is planted, at the confirmatory lr and evaluation."""
from experiments import sweeps as sweeps_lib
from experiments.sweeps import mismatch


def test_both_methods_in_every_group_and_corrections_only_with_a_mismatch():
  sweep = sweeps_lib.get_sweep('mismatch')
  groups = [g for g, _ in mismatch.GROUPS]
  assert sorted((r.group, r.label) for r in sweep.runs) == sorted(
      (g, label) for g in groups for label in ('GSPO', 'DFPO (Min-Replace)'))
  for r in sweep.runs:
    o = dict(r.overrides)
    assert o['optim.learning_rate'] == 1e-4
    planted = 'rollout.sampling.top_p' in o or 'rollout.sampler_dtype' in o
    assert planted or 'rollout.correction' not in o, r.name
  assert dict(sweep.shared)['eval.problems'] == 500 and sweep.seeds == 8
  assert len(sweeps_lib.get_sweep('mismatch', smoke=True).runs) == 4
