"""Tests of experiments/sweeps/lora.py: the rates are chosen on seeds 0-3 and judged on the other
seeds 4-7; each rank's arms share its chosen rate; full fine-tuning is the table1_confirm
setting; a missing choice is refused."""
import pytest

from experiments import schedule
from experiments import sweeps as sweeps_lib
from experiments.sweeps import lora


def _seeds(sweep):
  return set(range(sweep.first_seed, sweep.first_seed + sweep.seeds))


def test_the_rates_are_chosen_on_seeds_the_judgement_never_sees():
  choose, judge = sweeps_lib.get_sweep('lora_lr'), sweeps_lib.get_sweep('lora_rank')
  assert _seeds(choose) == {0, 1, 2, 3} and _seeds(judge) == {4, 5, 6, 7}
  grid = {(r.group, dict(r.overrides)['optim.learning_rate']) for r in choose.runs}
  assert grid == {(f'rank={k}', lr) for k in lora.RANKS for lr in lora.LR_GRID[k]}
  assert all(lora.BASELINE_LR in lora.LR_GRID[k] for k in lora.RANKS)
  assert {r.config for r in choose.runs} == {'gspo'}


def test_each_rank_is_judged_at_its_chosen_rate_for_both_methods():
  assert set(lora.CHOSEN_LR) == set(lora.RANKS)
  assert all(lora.CHOSEN_LR[k] in lora.LR_GRID[k] for k in lora.RANKS)
  judge = sweeps_lib.get_sweep('lora_rank')
  for r in judge.runs:
    o = dict(r.overrides)
    rank = o.get('lora.rank', 0)
    assert r.group == (f'rank={rank}' if rank else 'full')
    assert o['optim.learning_rate'] == (lora.CHOSEN_LR[rank] if rank else lora.FULL_LR)
  cells = {(r.group, r.config) for r in judge.runs}
  assert cells == {(g, m)
                   for g in ['full'] + [f'rank={k}'
                                        for k in lora.RANKS]
                   for m in ('gspo', 'dfpo_min_replace')}


def test_full_fine_tuning_is_the_setting_of_table1_confirm():
  """The 'full' arms differ from table1_confirm's lr 1e-4 pair only in the evaluation (the
  exploratory one, common random numbers) and the diagnostics (off): the same training."""
  full = [r for r in sweeps_lib.get_sweep('lora_rank').runs if r.group == 'full']
  t1 = [
      r for r in sweeps_lib.get_sweep('table1_confirm').runs if r.label in {x.label for x in full}
  ]
  training = lambda r: {k: v for k, v in r.overrides if not k.startswith(('eval.', 'log.'))}
  assert sorted(map(training, full), key=str) == sorted(map(training, t1), key=str)


def test_a_rank_without_its_chosen_rate_is_refused(monkeypatch):
  monkeypatch.setattr(lora, 'CHOSEN_LR', {1: 1e-3})
  with pytest.raises(ValueError, match=r'CHOSEN_LR for ranks \(1, 4, 16\).*has \[1\]'):
    sweeps_lib.get_sweep('lora_rank')


def test_every_run_parses_and_the_smoke_forms_train_a_rank():
  for name in lora.SWEEPS:
    smoke = sweeps_lib.get_sweep(name, smoke=True)
    assert {dict(r.overrides).get('lora.rank') for r in smoke.runs} >= {4}
    assert schedule.make_specs(smoke, 1)
