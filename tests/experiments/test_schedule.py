"""Tests of experiments.schedule: every sweep run parses like the trainer, a typo is refused before
any run, finished runs are skipped and unfinished ones resumed, identical runs are reused from
another sweep."""
import dataclasses
import json
import os

import pytest

from experiments import common
from experiments import credit_probe
from experiments import report
from experiments import schedule
from experiments import sweeps as sweeps_lib
from tests.experiments.fake_runs import fake_sweep, fake_command, launches, run_fake_sweep


def _all_runs():
  return [(n, r.name) for n in sweeps_lib.SWEEPS for r in sweeps_lib.get_sweep(n).runs]


@pytest.mark.parametrize('sweep_name,run_name', _all_runs())
def test_every_sweep_run_parses_like_the_trainer(sweep_name, run_name):
  """Each run's config + overrides is accepted by config_flags (typos, un-overridable keys). A
  probe sweep's shared 'probe.<field>' keys are its `credit_step.Setting` (an unknown field is a
  TypeError), the rest the trainer's."""
  sweep = sweeps_lib.get_sweep(sweep_name)
  if sweep.engine == 'probe':
    assert credit_probe.setting_of(sweep)
    sweep = dataclasses.replace(
        sweep, shared=tuple((k, v) for k, v in sweep.shared if not k.startswith('probe.')))
  spec = next(s for s in schedule.make_specs(sweep, 1) if s.run.name == run_name)
  config = schedule.validate_spec(spec)
  assert config.seed == 0 and config.num_steps == sweep.num_steps


def test_validate_spec_rejects_a_typo():
  sweep = sweeps_lib.Sweep(name='t', description='', baseline='GSPO', tables=(), num_steps=2,
                           seeds=1, runs=(sweeps_lib.Run('x', 'gspo', 'GSPO',
                                                         (('num_stepz', 3),)),))
  with pytest.raises(ValueError, match='num_stepz'):
    schedule.validate_spec(schedule.make_specs(sweep, 1)[0])


def test_runner_skips_finished_runs_and_resumes_unfinished(tmp_path):
  sweep = fake_sweep()
  make, counter = fake_command(tmp_path)
  out = run_fake_sweep(tmp_path, sweep, make)
  assert sorted(out) == ['base__s0', 'base__s1', 'better__s0', 'better__s1']
  assert {s for s, _ in out.values()} == {'ok'}
  assert len(launches(counter)) == 4
  summary = common.read_summary(str(tmp_path / 'res' / 'runs' / 'better__s1.json.gz'))
  assert summary['final']['step'] == 4 and summary['seed'] == 1
  assert summary['curves']['reward_mean']['step'] == [0, 1, 2, 3, 4]
  assert summary['overrides']['num_steps'] == 4 and summary['label'] == 'BETTER'

  # Second invocation: every summary exists -> nothing is launched.
  out = run_fake_sweep(tmp_path, sweep, make)
  assert {s for s, _ in out.values()} == {'skipped'}
  assert len(launches(counter)) == 4

  # A finished workdir whose summary was lost: summarised again without a launch.
  os.remove(tmp_path / 'res' / 'runs' / 'base__s0.json.gz')
  out = run_fake_sweep(tmp_path, sweep, make)
  assert out['base__s0'][0] == 'ok' and len(launches(counter)) == 4

  # More seeds: only the new ones run.
  out = run_fake_sweep(tmp_path, sweep, make, seeds=3)
  assert sorted(launches(counter)[4:]) == ['base', 'better']


def test_run_with_the_same_settings_is_reused_from_another_sweep(tmp_path):
  make, counter = fake_command(tmp_path)
  first = dataclasses.replace(
      fake_sweep(), name='first',
      runs=(sweeps_lib.Run('base', 'gspo', 'BASE'), sweeps_lib.Run('better', 'dapo', 'BETTER')))
  second = dataclasses.replace(
      fake_sweep(), name='second',
      runs=(sweeps_lib.Run('gspo_again', 'gspo', 'GSPO'), sweeps_lib.Run('new', 'grpo',
                                                                         'NEW')), baseline='GSPO')
  kw = dict(seeds=2, jobs=2, workroot=str(tmp_path / 'work'), make_command=make, validate=False,
            log=lambda *a: None)
  schedule.run_sweep(first, results_dir=str(tmp_path / 'res' / 'first'), **kw)
  out = schedule.run_sweep(second, results_dir=str(tmp_path / 'res' / 'second'), **kw)
  assert out['gspo_again__s1'] == ('reused', 'from first') and out['new__s0'][0] == 'ok'
  assert sorted(launches(counter)) == ['base', 'base', 'better', 'better', 'new', 'new']
  runs = tmp_path / 'res'
  original = common.read_summary(str(runs / 'first' / 'runs' / 'base__s1.json.gz'))
  reused = common.read_summary(str(runs / 'second' / 'runs' / 'gspo_again__s1.json.gz'))
  assert reused['curves'] == original['curves'] and reused['seed'] == 1
  assert (reused['sweep'], reused['run'], reused['label'],
          reused['reused_from']) == ('second', 'gspo_again', 'GSPO', 'first')
  md = report.write_results(second, results_dir=str(runs / 'second'),
                            md_path=str(runs / 'second.md'), command='x', wall_time_s=0.0,
                            revision='r', plot=False)
  assert '2 of these runs have exactly the settings of runs in first' in open(md).read()


def test_runner_resumes_a_killed_run_in_the_same_workdir(tmp_path):
  sweep = fake_sweep(names=('base',))
  make_partial, counter = fake_command(tmp_path, stop_at=2)
  out = run_fake_sweep(tmp_path, sweep, make_partial, seeds=1)
  assert out['base__s0'][0] == 'failed' and 'did not reach its last step' in out['base__s0'][1]
  assert not (tmp_path / 'res' / 'runs' / 'base__s0.json.gz').exists()
  make_full, _ = fake_command(tmp_path)
  out = run_fake_sweep(tmp_path, sweep, make_full, seeds=1)
  assert out['base__s0'][0] == 'ok'
  summary = common.read_summary(str(tmp_path / 'res' / 'runs' / 'base__s0.json.gz'))
  assert summary['curves']['reward_mean']['step'] == [0, 1, 2, 3, 4]  # no step twice
  assert not (tmp_path / 'res' / 'runs' / 'base__s0.failed.txt').exists()
