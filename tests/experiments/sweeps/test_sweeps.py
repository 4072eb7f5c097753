"""Tests of experiments.sweeps: every sweep is well formed (also its smoke form), compute is
matched within each comparison, and runs shared between sweeps have identical settings."""
import pytest

from experiments import common
from experiments import schedule
from experiments import summaries
from experiments import sweeps as sweeps_lib
from experiments.sweeps import lora


@pytest.mark.parametrize('name', sorted(sweeps_lib.SWEEPS))
@pytest.mark.parametrize('smoke', [False, True])
def test_sweeps_are_well_formed(name, smoke):
  sweep = sweeps_lib.get_sweep(name, smoke=smoke)
  assert len({r.name for r in sweep.runs}) == len(sweep.runs)
  labels = {(r.group, r.label) for r in sweep.runs}
  assert len(labels) == len(sweep.runs)
  for group in {r.group for r in sweep.runs}:
    assert (group, sweep.baseline) in labels, f'{name}: no baseline in group {group!r}'
  read = [k.strip() for t in sweep.tables for k in t.metric.partition(':')[2].split(' - ')]
  missing = [k for k in read + list(sweep.curve_keys) if not summaries.keeps_curve(k)]
  assert not missing, f'{name}: tables or plots read curves the summaries do not keep: {missing}'
  for table in sweep.tables:
    assert set(table.rows) <= {r.label for r in sweep.runs}
    assert table.metric.partition(':')[0] in common.EXTRACTORS
    assert not table.baseline or table.baseline in {r.label for r in sweep.runs}
  if smoke:
    assert sweep.config_arg == 'smoke' and sweep.num_steps <= 3 and sweep.seeds <= 2
  else:
    # Every verdict rests on >= 8 paired seeds; the LoRA sweeps split seeds 0-7 into the half
    # that chooses the rates and the half that judges at them (tests/.../test_lora.py).
    assert sweep.seeds >= 8 or name in lora.SWEEPS
    for table in sweep.tables:
      assert not table.expect or table.prediction, (name, table.title)


def test_compute_matching_within_each_comparison():
  """Runs compared with each other share steps and per-step rollout/update budgets."""
  budget_keys = ('num_steps', 'rollout.prompts_per_step', 'rollout.sampling.num_samples',
                 'rollout.sampling.max_new_tokens', 'optim.minibatch_prompts', 'optim.ppo_epochs',
                 'token_budget')
  for name in sweeps_lib.SWEEPS:
    sweep = sweeps_lib.get_sweep(name)
    for group in {r.group for r in sweep.runs}:
      specs = [s for s in schedule.make_specs(sweep, 1) if s.run.group == group]
      budgets = {tuple((k, dict(s.overrides).get(k)) for k in budget_keys) for s in specs}
      assert len(budgets) == 1, (name, group, budgets)


def test_runs_shared_between_sweeps_have_identical_settings():
  """mechanism and table2 read the table1 runs, offpolicy's mb=2 column, table4's G=8 column
  and table3's DFPO / GSPO rows are table1 runs: their keys (config + overrides) must be equal
  to be reused."""
  key = lambda name: {(s.run.label, s.run.group, s.key)
                      for s in schedule.make_specs(sweeps_lib.get_sweep(name), 1)}
  t1 = {k for _, _, k in key('table1')}
  assert {k for _, _, k in key('mechanism')} == t1
  assert {k for _, _, k in key('table2')} <= t1
  assert len({k for _, g, k in key('offpolicy') if g == 'mb=2'} & t1) == 3
  assert {k for _, g, k in key('table4') if g == 'G=8'} < t1
  assert not {k for _, g, k in key('table4') if g != 'G=8'} & t1
  assert len({k for _, _, k in key('table3')} & t1) == 3
