"""Tests of the experiment runner (experiments/run.py), sweeps and statistics.

The runner is exercised with a fake trainer command (a few lines of Python that write a
`metrics.jsonl`), so these tests need no model; the last test runs the `--smoke` form of every
sweep with the real trainer.
"""

import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from experiments import common
from experiments import report
from experiments import run as run_lib
from experiments import schedule
from experiments import stats
from experiments import summaries
from experiments import sweeps as sweeps_lib

# ---------------------------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------------------------


def test_bootstrap_ci_covers_true_mean_at_about_nominal_rate():
  rng = np.random.default_rng(123)
  true_mean, n, trials = 1.5, 20, 300
  covered = 0
  for i in range(trials):
    x = rng.normal(true_mean, 2.0, size=n)
    mean, lo, hi = stats.bootstrap_ci(x, num_resamples=1000, seed=i)
    assert mean == pytest.approx(x.mean())
    assert lo <= mean <= hi
    covered += lo <= true_mean <= hi
  # Percentile bootstrap slightly under-covers at n = 20 (about 0.93); 300 trials -> sd 0.015.
  assert 0.87 <= covered / trials <= 0.985


def test_bootstrap_ci_is_seeded_and_narrows_with_more_data():
  x = np.random.default_rng(0).normal(size=50)
  assert stats.bootstrap_ci(x, seed=7) == stats.bootstrap_ci(x, seed=7)
  _, lo_small, hi_small = stats.bootstrap_ci(x[:10], seed=0)
  _, lo_big, hi_big = stats.bootstrap_ci(x, seed=0)
  assert hi_big - lo_big < hi_small - lo_small
  # One seed: a mean, no interval.
  mean, lo, hi = stats.bootstrap_ci([3.0])
  assert mean == 3.0 and np.isnan(lo) and np.isnan(hi)


def test_paired_pvalue_small_for_clear_shift_large_for_none():
  rng = np.random.default_rng(1)
  base = rng.normal(50.0, 5.0, size=8)  # large between-seed spread ...
  shifted = base + 2.0 + rng.normal(0, 0.3, size=8)  # ... but a consistent paired shift
  assert stats.paired_bootstrap_pvalue(shifted, base) < 0.01
  # The same shift unpaired would be buried in the spread: pairing is what detects it.
  assert stats.bootstrap_ci(shifted)[1] < base.mean() < stats.bootstrap_ci(shifted)[2]
  noise = base + rng.normal(0, 0.3, size=8)
  noise = noise - (noise - base).mean()  # zero mean difference (up to rounding)
  assert stats.paired_bootstrap_pvalue(noise, base) > 0.9
  assert stats.paired_bootstrap_pvalue(base, base) == 1.0


def test_paired_pvalue_is_roughly_calibrated_under_the_null():
  rng = np.random.default_rng(2)
  pvals = [
      stats.paired_bootstrap_pvalue(rng.normal(size=12), rng.normal(size=12), num_resamples=500,
                                    seed=i) for i in range(200)
  ]
  pvals = np.array(pvals)
  assert np.all((pvals > 0) & (pvals <= 1))
  # Bootstrap tests are a bit liberal at small n; a broken test gives ~0 or ~1 here.
  assert 0.01 <= np.mean(pvals < 0.05) <= 0.12
  assert 0.35 <= np.median(pvals) <= 0.65


def test_paired_pvalue_is_symmetric_and_bounded_by_resamples():
  x, y = np.array([1.0, 2.0, 3.5, 4.0]), np.array([0.0, 0.5, 1.0, 1.5])
  assert stats.paired_bootstrap_pvalue(x, y, seed=3) == stats.paired_bootstrap_pvalue(y, x, seed=3)
  assert stats.paired_bootstrap_pvalue(x, y, num_resamples=99) >= 1 / 100


def test_ratio_of_means_ci_exact_ratio_and_bad_input():
  y = np.array([1.0, 2.0, 4.0, 3.0])
  r, lo, hi = stats.ratio_of_means_ci(0.5 * y, y)
  assert (r, lo, hi) == pytest.approx((0.5, 0.5, 0.5))
  with pytest.raises(ValueError, match='equal lengths'):
    stats.paired_bootstrap_pvalue([1.0, 2.0], [1.0])
  with pytest.raises(ValueError, match='non-finite'):
    stats.bootstrap_ci([1.0, float('nan')])
  with pytest.raises(ValueError, match='level'):
    stats.bootstrap_ci([1.0, 2.0], level=95)


# ---------------------------------------------------------------------------------------------
# Sweeps.
# ---------------------------------------------------------------------------------------------


def test_unknown_sweep_lists_the_valid_ones(capsys):
  with pytest.raises(ValueError, match=r"unknown sweep 'nope'.*table1"):
    sweeps_lib.get_sweep('nope')
  with pytest.raises(SystemExit) as e:
    run_lib.main(['nope', '--tables-only'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "'nope'" in err and all(name in err for name in sweeps_lib.SWEEPS)


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
    assert sweep.seeds >= 8  # every verdict rests on >= 8 paired seeds
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


def test_num_steps_knob_resizes_the_sweep():
  sweep = sweeps_lib.get_sweep('table1', num_steps=7)
  specs = schedule.make_specs(sweep, 2)
  assert all(dict(s.overrides)['num_steps'] == 7 for s in specs)
  assert len({s.run_id for s in specs}) == 2 * len(sweep.runs)
  assert specs[0].key != schedule.make_specs(sweeps_lib.get_sweep('table1'), 1)[0].key


def _all_runs():
  return [(n, r.name) for n in sweeps_lib.SWEEPS for r in sweeps_lib.get_sweep(n).runs]


@pytest.mark.parametrize('sweep_name,run_name', _all_runs())
def test_every_sweep_run_parses_like_the_trainer(sweep_name, run_name):
  """Each run's config + overrides is accepted by config_flags (typos, un-overridable keys)."""
  sweep = sweeps_lib.get_sweep(sweep_name)
  spec = next(s for s in schedule.make_specs(sweep, 1) if s.run.name == run_name)
  config = schedule.validate_spec(spec)
  assert config.seed == 0 and config.num_steps == sweep.num_steps


def test_validate_spec_rejects_a_typo():
  sweep = sweeps_lib.Sweep(name='t', description='', baseline='GSPO', tables=(), num_steps=2,
                           seeds=1, runs=(sweeps_lib.Run('x', 'gspo', 'GSPO',
                                                         (('num_stepz', 3),)),))
  with pytest.raises(ValueError, match='num_stepz'):
    schedule.validate_spec(schedule.make_specs(sweep, 1)[0])


# ---------------------------------------------------------------------------------------------
# The runner, with a fake trainer.
# ---------------------------------------------------------------------------------------------

# Writes metrics.jsonl for steps 0..N like jtc.train would, resuming after the last step found;
# accuracy is higher for 'better' runs; a run named 'broken' fails; every launch is counted.
_FAKE_TRAINER = r'''
import json, os, sys
workdir, name, seed, n, counter, stop_at = sys.argv[1:7]
seed, n, stop_at = int(seed), int(n), int(stop_at)
with open(counter, 'a') as f:
  f.write(name + '\n')
if name == 'broken':
  sys.stderr.write('Traceback: something broke in ' + name + '\n')
  sys.exit(3)
path = os.path.join(workdir, 'metrics.jsonl')
done = []
if os.path.exists(path):
  done = [json.loads(l) for l in open(path)]
start = done[-1]['step'] + 1 if done else 0
bonus = 0.1 if name == 'better' else 0.0
with open(path, 'a') as f:
  for step in range(start, n + 1):
    if step > stop_at:
      sys.exit(0)
    r = 0.2 + 0.05 * step + bonus + 0.01 * seed
    rec = {'step': step, 'reward_mean': r, 'accuracy': r, 'entropy': 1.0 - 0.01 * step,
           'asym': 0.5 - bonus, 'compute/generated_tokens': 100 * step,
           'eval/avg@4': 0.3 + bonus + 0.01 * seed}
    f.write(json.dumps(rec) + '\n')
'''


def _fake_sweep(names=('base', 'better'), num_steps=4):
  runs = tuple(sweeps_lib.Run(n, 'gspo', n.upper()) for n in names)
  tables = (sweeps_lib.Table('acc', 'final:eval/avg@', unit='(%)', scale=100.0,
                             expect=(('BETTER', '>'),)),
            sweeps_lib.Table('jitter', 'jitter2:reward_mean', higher_is_better=False),
            sweeps_lib.Table('compute', 'compute_at:reward_mean', normalize=True, threshold='auto'))
  return sweeps_lib.Sweep(name='fake', description='a fake sweep', runs=runs, baseline='BASE',
                          tables=tables, num_steps=num_steps, seeds=2)


def _fake_command(tmp_path, stop_at=10**9):
  script = tmp_path / 'fake_trainer.py'
  script.write_text(_FAKE_TRAINER)
  counter = tmp_path / 'launches.txt'

  def make(spec, workdir):
    return [
        sys.executable,
        str(script), workdir, spec.run.name,
        str(spec.seed),
        str(spec.num_steps),
        str(counter),
        str(stop_at)
    ]

  return make, counter


def _launches(counter):
  return counter.read_text().split() if counter.exists() else []


def _run(tmp_path, sweep, make, seeds=2):
  return schedule.run_sweep(sweep, seeds=seeds, jobs=2, results_dir=str(tmp_path / 'res'),
                            workroot=str(tmp_path / 'work'), make_command=make, validate=False,
                            log=lambda *a: None)


def test_runner_skips_finished_runs_and_resumes_unfinished(tmp_path):
  sweep = _fake_sweep()
  make, counter = _fake_command(tmp_path)
  out = _run(tmp_path, sweep, make)
  assert sorted(out) == ['base__s0', 'base__s1', 'better__s0', 'better__s1']
  assert {s for s, _ in out.values()} == {'ok'}
  assert len(_launches(counter)) == 4
  summary = json.loads((tmp_path / 'res' / 'runs' / 'better__s1.json').read_text())
  assert summary['final']['step'] == 4 and summary['seed'] == 1
  assert summary['curves']['reward_mean']['step'] == [0, 1, 2, 3, 4]
  assert summary['overrides']['num_steps'] == 4 and summary['label'] == 'BETTER'

  # Second invocation: every summary exists -> nothing is launched.
  out = _run(tmp_path, sweep, make)
  assert {s for s, _ in out.values()} == {'skipped'}
  assert len(_launches(counter)) == 4

  # A finished workdir whose summary was lost: summarised again without a launch.
  os.remove(tmp_path / 'res' / 'runs' / 'base__s0.json')
  out = _run(tmp_path, sweep, make)
  assert out['base__s0'][0] == 'ok' and len(_launches(counter)) == 4

  # More seeds: only the new ones run.
  out = _run(tmp_path, sweep, make, seeds=3)
  assert sorted(_launches(counter)[4:]) == ['base', 'better']


def test_run_with_the_same_settings_is_reused_from_another_sweep(tmp_path):
  make, counter = _fake_command(tmp_path)
  first = dataclasses.replace(
      _fake_sweep(), name='first',
      runs=(sweeps_lib.Run('base', 'gspo', 'BASE'), sweeps_lib.Run('better', 'dapo', 'BETTER')))
  second = dataclasses.replace(
      _fake_sweep(), name='second',
      runs=(sweeps_lib.Run('gspo_again', 'gspo', 'GSPO'), sweeps_lib.Run('new', 'grpo',
                                                                         'NEW')), baseline='GSPO')
  kw = dict(seeds=2, jobs=2, workroot=str(tmp_path / 'work'), make_command=make, validate=False,
            log=lambda *a: None)
  schedule.run_sweep(first, results_dir=str(tmp_path / 'res' / 'first'), **kw)
  out = schedule.run_sweep(second, results_dir=str(tmp_path / 'res' / 'second'), **kw)
  assert out['gspo_again__s1'] == ('reused', 'from first') and out['new__s0'][0] == 'ok'
  assert sorted(_launches(counter)) == ['base', 'base', 'better', 'better', 'new', 'new']
  runs = tmp_path / 'res'
  original = json.loads((runs / 'first' / 'runs' / 'base__s1.json').read_text())
  reused = json.loads((runs / 'second' / 'runs' / 'gspo_again__s1.json').read_text())
  assert reused['curves'] == original['curves'] and reused['seed'] == 1
  assert (reused['sweep'], reused['run'], reused['label'],
          reused['reused_from']) == ('second', 'gspo_again', 'GSPO', 'first')
  md = report.write_results(second, results_dir=str(runs / 'second'),
                            md_path=str(runs / 'second.md'), command='x', wall_time_s=0.0,
                            revision='r', plot=False)
  assert '2 of these runs have exactly the settings of runs in first' in open(md).read()


def test_runner_resumes_a_killed_run_in_the_same_workdir(tmp_path):
  sweep = _fake_sweep(names=('base',))
  make_partial, counter = _fake_command(tmp_path, stop_at=2)
  out = _run(tmp_path, sweep, make_partial, seeds=1)
  assert out['base__s0'][0] == 'failed' and 'did not reach its last step' in out['base__s0'][1]
  assert not (tmp_path / 'res' / 'runs' / 'base__s0.json').exists()
  make_full, _ = _fake_command(tmp_path)
  out = _run(tmp_path, sweep, make_full, seeds=1)
  assert out['base__s0'][0] == 'ok'
  summary = json.loads((tmp_path / 'res' / 'runs' / 'base__s0.json').read_text())
  assert summary['curves']['reward_mean']['step'] == [0, 1, 2, 3, 4]  # no step twice
  assert not (tmp_path / 'res' / 'runs' / 'base__s0.failed.txt').exists()


def test_failed_run_reports_stderr_and_others_continue(tmp_path, monkeypatch):
  sweep = _fake_sweep(names=('base', 'broken', 'better'))
  make, _ = _fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  rc = run_lib.main(['fake', '--seeds', '2', '--jobs', '2', '--workroot',
                     str(tmp_path / 'w')], make_command=make,
                    results_root=str(tmp_path / 'results'))
  assert rc == 1
  runs_dir = tmp_path / 'results' / 'fake' / 'runs'
  assert sorted(p.name for p in runs_dir.glob('*.json')) == [
      'base__s0.json', 'base__s1.json', 'better__s0.json', 'better__s1.json'
  ]
  md = (tmp_path / 'results' / 'fake.md').read_text()
  assert '## Failed runs' in md and 'something broke in broken' in md
  assert 'exit status 3' in md

  # Rebuilding the tables keeps the sweep's own command (and the failures found on disk).
  run_lib.main(['fake', '--tables-only'], make_command=make, results_root=str(tmp_path / 'results'))
  md = (tmp_path / 'results' / 'fake.md').read_text()
  assert '- Command: `python -m experiments.run fake --seeds 2 --jobs 2 --workroot' in md
  assert 'rebuilt from the per-run summaries by `python -m experiments.run fake --tables-only`' in md
  assert 'something broke in broken' in md


def test_refresh_curves_rereads_a_curve_the_summaries_did_not_keep(tmp_path, monkeypatch):
  """Summaries written before a curve was kept (the mismatch sweep's correction/* once) get it
  back from the runs' metrics.jsonl; all or nothing, and only with --tables-only."""
  sweep = _fake_sweep()
  make, _ = _fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  argv = ['fake', '--jobs', '2', '--workroot', str(tmp_path / 'w')]
  results = str(tmp_path / 'results')
  assert run_lib.main(argv, make_command=make, results_root=results) == 0
  runs_dir = tmp_path / 'results' / 'fake' / 'runs'
  full = {p.name: json.loads(p.read_text()) for p in runs_dir.glob('*.json')}
  for name, summary in full.items():  # as summarised before 'asym' was a kept curve
    curves = {k: v for k, v in summary['curves'].items() if k != 'asym'}
    (runs_dir / name).write_text(json.dumps(dict(summary, curves=curves)))
  lost = tmp_path / 'lost.jsonl'
  os.replace(os.path.join(full['base__s0.json']['workdir'], 'metrics.jsonl'), lost)
  refresh = ['fake', '--tables-only', '--refresh-curves']
  assert run_lib.main(refresh, results_root=results) == 1  # base__s0's metrics are gone
  assert all('asym' not in json.loads(p.read_text())['curves'] for p in runs_dir.glob('*.json'))
  os.replace(lost, os.path.join(full['base__s0.json']['workdir'], 'metrics.jsonl'))
  assert run_lib.main(refresh, results_root=results) == 0
  assert {p.name: json.loads(p.read_text()) for p in runs_dir.glob('*.json')} == full
  with pytest.raises(SystemExit):
    run_lib.main(argv + ['--refresh-curves'], make_command=make, results_root=results)


def _write_fake_summaries(results_dir, sweep, acc_by_label, seeds):
  """Summaries as the runner writes them, from synthetic metrics; returns the values."""
  specs = schedule.make_specs(sweep, seeds)
  for spec in specs:
    acc = acc_by_label[spec.run.label][spec.seed]
    records = [{
        'step': s,
        'reward_mean': 0.1 * s + acc,
        'accuracy': acc,
        'compute/generated_tokens': 1000 * s,
        'eval/avg@4': acc
    } for s in range(sweep.num_steps + 1)]
    summary = summaries.make_summary(spec, '/nowhere', records, wall_time_s=1.0, command=['x'])
    summaries.write_json(summaries.summary_path(results_dir, spec), summary)  # pylint: disable=protected-access


def _table_rows(md):
  """The cells of every data row of the long-format tables in ``md``."""
  return [[c.strip()
           for c in l.split('|')[1:-1]]
          for l in md.splitlines()
          if l.startswith('| ') and not l.startswith('| group ')]


def test_tables_rebuild_from_summaries_alone(tmp_path):
  sweep = sweeps_lib.get_sweep('table1')
  rng = np.random.default_rng(0)
  base = rng.uniform(0.3, 0.5, size=8)
  acc = {
      lab: base + (0.08 if lab.startswith('DFPO') else 0.0) + rng.normal(0, .002, 8)
      for lab in {r.label for r in sweep.runs}
  }
  acc['GSPO'] = base
  results_dir, md_path = report.result_paths('table1', smoke=False, results_root=str(tmp_path))
  _write_fake_summaries(results_dir, sweep, acc, seeds=8)
  rc = run_lib.main(['table1', '--tables-only'], results_root=str(tmp_path))
  assert rc == 0
  md = open(md_path).read()
  assert os.path.exists(os.path.join(results_dir, 'curves.png'))
  assert 'python -m experiments.run table1 --tables-only' in md and 'Code revision' in md
  assert 'Prediction (from the paper, written before the run)' in md
  # Long format: one row per (learning rate, method): group, run, value, diff vs GSPO,
  # p (sign-flip), seeds, paper, claim: verdict.
  rows = {}
  for c in _table_rows(md):  # the first table's rows: final held-out accuracy
    rows.setdefault((c[0], c[1].removesuffix(' (baseline)')), c)
  for label in {r.label for r in sweep.runs}:
    assert rows[('lr=1e-4', label)][2].startswith(f'{100 * np.mean(acc[label]):.1f} [')
  dfpo = rows[('lr=1e-4', 'DFPO (Min-Replace)')]
  assert dfpo[3].startswith(f'{100 * np.mean(acc["DFPO (Min-Replace)"] - base):.1f} [')
  assert float(dfpo[4]) == pytest.approx(2 / 2**8, rel=1e-2)  # every seed up
  assert dfpo[5] == '8' and rows[('lr=1e-4', 'GSPO')][3] == ''

  # Smoke results go elsewhere and do not touch the real file.
  smoke_dir, smoke_md = report.result_paths('table1', smoke=True, results_root=str(tmp_path))
  assert smoke_dir != results_dir and smoke_md != md_path


def test_a_table_can_compare_against_another_baseline(tmp_path):
  sweep = _fake_sweep()
  acc = {'BASE': [0.30, 0.40], 'BETTER': [0.50, 0.55]}
  _write_fake_summaries(str(tmp_path), sweep, acc, seeds=2)
  table = sweeps_lib.Table('acc', 'final:eval/avg@', scale=100.0, baseline='BETTER',
                           expect=(('BASE', '<'),))
  lines = report.build_table(sweep, table, common.load_summaries(str(tmp_path)))
  rows = {c[1]: c for c in _table_rows('\n'.join(lines))}
  assert 'diff vs BETTER' in lines[2] and 'BETTER (baseline)' in rows
  assert rows['BASE'][3].startswith(f'{100 * (0.35 - 0.525):.1f}')


def test_a_table_against_zero_detects_a_one_sided_change_and_not_a_symmetric_one(tmp_path):
  sweep = dataclasses.replace(_fake_sweep(), seeds=8)
  drifted = np.linspace(0.1, 0.8, 8)  # every seed moves the same way: a systematic change
  acc = {'BASE': drifted, 'BETTER': drifted * np.array([1, -1, -1, 1, -1, 1, 1, -1])}
  _write_fake_summaries(str(tmp_path), sweep, acc, seeds=8)
  table = sweeps_lib.Table('change', 'final:eval/avg@', against_zero=True)
  lines = report.build_table(sweep, table, common.load_summaries(str(tmp_path)))
  rows = {c[1]: c for c in _table_rows('\n'.join(lines))}
  assert 'diff vs 0' in lines[2] and set(rows) == {'BASE', 'BETTER'}  # no baseline row
  assert rows['BASE'][3].startswith(f'{drifted.mean():.3f}')
  assert float(rows['BASE'][4]) == pytest.approx(2 / 2**8, rel=1e-2)  # the smallest p of 8
  assert float(rows['BETTER'][4]) > 0.5
  with pytest.raises(ValueError, match='against_zero'):
    sweeps_lib.Table('bad', 'final:eval/avg@', against_zero=True, normalize=True)


def test_a_metric_of_the_difference_of_two_curves():
  summary = {
      'curves': {
          'a': {
              'step': [0, 5, 10],
              'value': [0.0, 1.0, 3.0]
          },
          'b': {
              'step': [0, 5, 10],
              'value': [1.0, 1.0, 0.5]
          },
          'c': {
              'step': [0, 10],
              'value': [0.0, 1.0]
          }
      }
  }
  assert common.metric_value(summary, 'change:a - b') == pytest.approx(3.0 - (-0.5))
  assert np.isnan(common.metric_value(summary, 'final:a - missing'))  # a missing curve
  with pytest.raises(ValueError, match='same steps'):
    common.metric_value(summary, 'change:a - c')


def _phrasing_walk(rng, num_runs, *, steps=150, prompts=16, group=8, lr=8.0, bias=0.0):
  """Changes of log q(f) for (answer, result, final) over ``num_runs`` tabular policies trained
  with token-level group-normalised REINFORCE (exchangeable updates). Like the phrasing task's
  tokens: the first choice is 'F'inal vs 'T'he (p = 1/3 vs 2/3), then 'a'nswer vs 'r'esult.
  Reward ~ Bernoulli(0.5 + bias * [answer]): bias = 0 is phrasing-irrelevant. [num_runs, 3]."""
  z1, z2 = np.full(num_runs, np.log(0.5)), np.zeros(num_runs)
  shape = (num_runs, prompts, group)
  for _ in range(steps):
    p_final, p_answer = 1 / (1 + np.exp(-z1)), 1 / (1 + np.exp(-z2))
    final = rng.random(shape) < p_final[:, None, None]
    answer = (rng.random(shape) < p_answer[:, None, None]) & ~final
    r = (rng.random(shape) < 0.5 + bias * answer).astype(np.float64)
    adv = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
    z1 += lr * (adv * (final - p_final[:, None, None])).mean((1, 2))
    z2 += lr * (adv * ~final * (answer - p_answer[:, None, None])).mean((1, 2))
  p_final, p_answer = 1 / (1 + np.exp(-z1)), 1 / (1 + np.exp(-z2))
  q = np.stack([(1 - p_final) * p_answer, (1 - p_final) * (1 - p_answer), p_final], 1)
  return np.log(q) - np.log(1 / 3)


def _rejection_rate(changes_R, seeds=8):
  """Share of sets of ``seeds`` runs whose exact sign-flip test against 0 has p < 0.05."""
  sets = changes_R.reshape(-1, seeds)
  return np.mean([stats.paired_signflip_pvalue(x, np.zeros(seeds)) < 0.05 for x in sets])


def test_drift_of_a_phrasing_pair_log_odds_is_a_valid_test_and_a_log_share_is_not():
  """The drift sweep's systematic-drift table: with phrasing-irrelevant reward and exchangeable
  updates, the phrasing distribution still collapses (a random walk), and every log-share falls
  on most seeds, so testing one log-share against 0 rejects far above 5%; the log-odds of the
  two phrasings exchangeable by construction keeps its level, and detects a reward that
  prefers one of them (the known-positive control)."""
  null = _phrasing_walk(np.random.default_rng(0), 160)
  q = np.exp(null + np.log(1 / 3))
  assert np.mean(-(q * np.log(q)).sum(1)) < 0.8  # collapsed from log 3 = 1.10, as in the runs
  assert max(_rejection_rate(null[:, 0]), _rejection_rate(null[:, 1])) >= 0.2
  assert _rejection_rate(null[:, 0] - null[:, 1]) <= 0.1
  biased = _phrasing_walk(np.random.default_rng(1), 160, bias=0.05)
  assert _rejection_rate(biased[:, 0] - biased[:, 1]) >= 0.8


def test_grouped_table_and_normalised_compute(tmp_path):
  sweep = _fake_sweep()
  make, _ = _fake_command(tmp_path)
  results_dir = str(tmp_path / 'res')
  _run(tmp_path, sweep, make, seeds=3)
  md_path = str(tmp_path / 'fake.md')
  report.write_results(sweep, results_dir=results_dir, md_path=md_path, command='cmd',
                       wall_time_s=0.0, revision='abc', plot=False)
  rows = [c for c in _table_rows(open(md_path).read()) if c[1] == 'BETTER']
  # acc: 30 + seed vs 40 + seed -> diff exactly +10.0 points, CI collapses to a point.
  assert rows[0][3] == '10.0 [10.0, 10.0]'
  # compute table: 'better' reaches the threshold earlier (reward is +0.1 everywhere).
  assert float(rows[2][3].split('[')[0]) < 1.0

  # The grouped layout from a real sweep definition (table1: one row per learning rate).
  sweep1 = sweeps_lib.get_sweep('table1')
  rd, md1 = report.result_paths('table1', smoke=False, results_root=str(tmp_path))
  acc = {
      lab: np.array([0.4, 0.5, 0.45]) + (0.05 if lab.startswith('DFPO') else 0.0)
      for lab in {r.label for r in sweep1.runs}
  }
  _write_fake_summaries(rd, sweep1, acc, seeds=3)
  report.write_results(sweep1, results_dir=rd, md_path=md1, command='cmd', wall_time_s=0.0,
                       revision='abc', plot=False)
  rows = _table_rows(open(md1).read())
  for name, _ in sweeps_lib.LEARNING_RATES:
    row = next(c for c in rows if c[:2] == [f'lr={name}', 'DFPO (Min-Replace)'])
    assert row[3] == '5.0 [5.0, 5.0]' and row[5] == '3'


@pytest.mark.slow
def test_every_smoke_sweep_end_to_end(tmp_path):
  """The `--smoke` form of every sweep with the real trainer, in the order of the issue; runs
  with identical settings are shared between sweeps, as in the full sweeps."""
  root = tmp_path / 'results'
  launched = []
  for name in sweeps_lib.SWEEPS:

    def command(spec, workdir, name=name):
      launched.append((name, spec.run_id))
      return schedule.trainer_command(spec, workdir)

    rc = run_lib.main([name, '--smoke', '--jobs', '2', '--workroot',
                       str(tmp_path / 'w')], make_command=command, results_root=str(root))
    assert rc == 0, name
    sweep = sweeps_lib.get_sweep(name, smoke=True)
    md = (root / 'smoke' / f'{name}.md').read_text()
    assert 'Could not build' not in md and 'Failed runs' not in md, name
    for table in sweep.tables:
      assert f'### {table.title}' in md
    for run in sweep.runs:
      assert run.label in md, (name, run.label)
    summaries = common.load_summaries(str(root / 'smoke' / name))
    assert sorted(s['run'] for s in summaries) == sorted(r.name for r in sweep.runs)
    assert all(s['final']['step'] == sweep.num_steps for s in summaries)
  # table2's and mechanism's rows are table1's runs: none of them was launched again.
  assert not [r for n, r in launched if n in ('table2', 'mechanism')]


def test_compare_reports_the_exact_sign_flip_p_beside_the_bootstrap_one():
  # 5 seeds all up -> the exact sign-flip p is its floor 2/2^5; the bootstrap p is smaller.
  row = report.compare({i: 1.0 + i for i in range(5)}, {i: 0.5 + i for i in range(5)})
  assert row['p'] == pytest.approx(0.0625) and row['p_boot'] < 0.0625 and row['n_pairs'] == 5


def test_a_resized_sweep_never_touches_the_committed_results(tmp_path, monkeypatch):
  """The try-out of issue 15: `--num-steps 1 --seeds 1` once overwrote an 80-step sweep's
  summaries and results file. Resized sweeps go to scratch/, a summary with other settings is
  refused without --replace, and an invocation that runs nothing new leaves the file as is."""
  sweep = _fake_sweep(num_steps=4)
  make, counter = _fake_command(tmp_path)
  monkeypatch.setattr(
      sweeps_lib, 'get_sweep', lambda *a, num_steps=None, **k:
      (dataclasses.replace(sweep, num_steps=num_steps) if num_steps else sweep))
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  root = tmp_path / 'results'
  args = ['fake', '--jobs', '2', '--workroot', str(tmp_path / 'w')]
  assert run_lib.main(args, make_command=make, results_root=str(root)) == 0
  canonical = {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json')}
  md = (root / 'fake.md').read_bytes()
  # A quick try-out with another num_steps: written under scratch/, nothing canonical changes.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1'], make_command=make,
                      results_root=str(root)) == 0
  assert (root / 'scratch' / 'fake' / 'runs' / 'base__s0.json').exists()
  assert {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json')} == canonical
  assert (root / 'fake.md').read_bytes() == md
  # Forced into the canonical root, it is refused run by run instead of replacing them.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1', '--canonical'], make_command=make,
                      results_root=str(root)) == 1
  assert {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json')} == canonical
  # Re-running the sweep as defined with fewer seeds runs nothing and rewrites nothing.
  n = len(_launches(counter))
  assert run_lib.main(args + ['--seeds', '1'], make_command=make, results_root=str(root)) == 0
  assert len(_launches(counter)) == n
  # --replace is the explicit request that may replace a summary.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1', '--canonical', '--replace'],
                      make_command=make, results_root=str(root)) == 0
  assert json.loads((root / 'fake' / 'runs' / 'base__s0.json').read_text())['num_steps'] == 1


def test_a_sweep_run_in_parts_runs_each_part_once_and_lists_the_parts(tmp_path, monkeypatch):
  sweep = _fake_sweep(num_steps=4)
  make, counter = _fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  root = tmp_path / 'results'
  args = ['fake', '--jobs', '2', '--seeds', '2', '--workroot', str(tmp_path / 'w')]
  with pytest.raises(SystemExit):  # an unknown run is refused before anything runs
    run_lib.main(args + ['--runs', 'base,nope'], make_command=make, results_root=str(root))
  assert _launches(counter) == []
  assert run_lib.main(args + ['--runs', 'base'], make_command=make, results_root=str(root)) == 0
  assert sorted(_launches(counter)) == ['base', 'base']
  assert 'BETTER' in (root / 'fake.md').read_text()  # the tables cover the whole sweep
  assert run_lib.main(args, make_command=make, results_root=str(root)) == 0
  assert sorted(_launches(counter)) == ['base', 'base', 'better', 'better']
  parts = json.loads((root / 'fake' / 'invocation.json').read_text())['parts']
  assert [p['command'].endswith('--runs base') for p in parts] == [True, False]
  assert all(p['wall_time_s'] >= 0 for p in parts)
  old = dict(command='old', wall_time_s=1.0)  # the single-invocation file of earlier revisions
  assert report.invocation_parts(old) == [old]
