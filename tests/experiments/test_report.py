"""Tests of experiments.report: a results file rebuilds from the summaries alone, tables against
another baseline or against zero, grouped and normalised tables, the exact sign-flip p beside
the bootstrap one."""
import dataclasses
import os

import numpy as np
import pytest

from experiments import common
from experiments import report
from experiments import run as run_lib
from experiments import schedule
from experiments import summaries
from experiments import sweeps as sweeps_lib
from tests.experiments.fake_runs import fake_sweep, fake_command, run_fake_sweep


def write_fake_summaries(results_dir, sweep, acc_by_label, seeds, pass_by_label=None):
  """Summaries as the runner writes them, from synthetic metrics; returns the values.
  ``pass_by_label``: pass@4 values as well (runs made before pass@k was logged have none)."""
  specs = schedule.make_specs(sweep, seeds)
  for spec in specs:
    acc = acc_by_label[spec.run.label][spec.seed]
    passes = {} if pass_by_label is None else {
        'eval/pass@1': acc,
        'eval/pass@2': (acc + pass_by_label[spec.run.label][spec.seed]) / 2,
        'eval/pass@4': pass_by_label[spec.run.label][spec.seed]
    }
    records = [{
        'step': s,
        'reward_mean': 0.1 * s + acc,
        'accuracy': acc,
        'compute/generated_tokens': 1000 * s,
        'eval/avg@4': acc,
        **passes
    } for s in range(sweep.num_steps + 1)]
    summary = summaries.make_summary(spec, '/nowhere', records, wall_time_s=1.0, command=['x'])
    summaries.write_json(summaries.summary_path(results_dir, spec), summary)


def table_rows(md):
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
  write_fake_summaries(results_dir, sweep, acc, seeds=8)
  rc = run_lib.main(['table1', '--tables-only'], results_root=str(tmp_path))
  assert rc == 0
  md = open(md_path).read()
  assert os.path.exists(os.path.join(results_dir, 'curves.png'))
  assert 'python -m experiments.run table1 --tables-only' in md and 'Code revision' in md
  # The source of a prediction is named by its text (a paper, or jtc's own account), not assumed.
  assert 'Prediction (written before the run; its source named first): paper Table 1' in md
  # Long format: one row per (learning rate, method): group, run, value, diff vs GSPO,
  # p (sign-flip), seeds, paper, claim: verdict.
  rows = {}
  for c in table_rows(md):  # the first table's rows: final held-out accuracy
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


def test_an_accuracy_table_gets_its_pass_at_k_companion_when_the_runs_logged_it(tmp_path):
  """The companion reads the largest K (pass@4, not pass@1 or pass@2) and adds no claim; runs
  without pass@ (older summaries) get none."""
  sweep = fake_sweep()
  acc = {'BASE': [0.30, 0.40], 'BETTER': [0.50, 0.55]}
  write_fake_summaries(str(tmp_path), sweep, acc, seeds=2)
  md = open(_write(sweep, tmp_path)).read()
  assert 'pass@' not in md
  write_fake_summaries(str(tmp_path), sweep, acc, seeds=2, pass_by_label={
      'BASE': [0.6, 0.7],
      'BETTER': [0.8, 0.9]
  })
  md = open(_write(sweep, tmp_path)).read()
  assert '### acc: pass@4 (unbiased, from the same samples)' in md
  section = md.split('### acc: pass@4')[1].split('###')[0]
  rows = {c[1].removesuffix(' (baseline)'): c for c in table_rows(section)}
  assert rows['BASE'][2].startswith('65.0 [') and rows['BETTER'][2].startswith('85.0 [')
  assert rows['BETTER'][3].startswith('20.0 [') and 'Prediction' not in section


def _write(sweep, tmp_path):
  return report.write_results(sweep, results_dir=str(tmp_path), md_path=str(tmp_path / 'x.md'),
                              command='c', wall_time_s=1.0, plot=False)


def test_a_table_can_compare_against_another_baseline(tmp_path):
  sweep = fake_sweep()
  acc = {'BASE': [0.30, 0.40], 'BETTER': [0.50, 0.55]}
  write_fake_summaries(str(tmp_path), sweep, acc, seeds=2)
  table = sweeps_lib.Table('acc', 'final:eval/avg@', scale=100.0, baseline='BETTER',
                           expect=(('BASE', '<'),))
  lines = report.build_table(sweep, table, common.load_summaries(str(tmp_path)))
  rows = {c[1]: c for c in table_rows('\n'.join(lines))}
  assert 'diff vs BETTER' in lines[2] and 'BETTER (baseline)' in rows
  assert rows['BASE'][3].startswith(f'{100 * (0.35 - 0.525):.1f}')


def test_a_table_against_zero_detects_a_one_sided_change_and_not_a_symmetric_one(tmp_path):
  sweep = dataclasses.replace(fake_sweep(), seeds=8)
  drifted = np.linspace(0.1, 0.8, 8)  # every seed moves the same way: a systematic change
  acc = {'BASE': drifted, 'BETTER': drifted * np.array([1, -1, -1, 1, -1, 1, 1, -1])}
  write_fake_summaries(str(tmp_path), sweep, acc, seeds=8)
  table = sweeps_lib.Table('change', 'final:eval/avg@', against_zero=True)
  lines = report.build_table(sweep, table, common.load_summaries(str(tmp_path)))
  rows = {c[1]: c for c in table_rows('\n'.join(lines))}
  assert 'diff vs 0' in lines[2] and set(rows) == {'BASE', 'BETTER'}  # no baseline row
  assert rows['BASE'][3].startswith(f'{drifted.mean():.3f}')
  assert float(rows['BASE'][4]) == pytest.approx(2 / 2**8, rel=1e-2)  # the smallest p of 8
  assert float(rows['BETTER'][4]) > 0.5
  with pytest.raises(ValueError, match='against_zero'):
    sweeps_lib.Table('bad', 'final:eval/avg@', against_zero=True, normalize=True)


def test_grouped_table_and_normalised_compute(tmp_path):
  sweep = fake_sweep()
  make, _ = fake_command(tmp_path)
  results_dir = str(tmp_path / 'res')
  run_fake_sweep(tmp_path, sweep, make, seeds=3)
  md_path = str(tmp_path / 'fake.md')
  report.write_results(sweep, results_dir=results_dir, md_path=md_path, command='cmd',
                       wall_time_s=0.0, revision='abc', plot=False)
  rows = [c for c in table_rows(open(md_path).read()) if c[1] == 'BETTER']
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
  write_fake_summaries(rd, sweep1, acc, seeds=3)
  report.write_results(sweep1, results_dir=rd, md_path=md1, command='cmd', wall_time_s=0.0,
                       revision='abc', plot=False)
  rows = table_rows(open(md1).read())
  for name, _ in sweeps_lib.LEARNING_RATES:
    row = next(c for c in rows if c[:2] == [f'lr={name}', 'DFPO (Min-Replace)'])
    assert row[3] == '5.0 [5.0, 5.0]' and row[5] == '3'


def test_compare_reports_the_exact_sign_flip_p_beside_the_bootstrap_one():
  # 5 seeds all up -> the exact sign-flip p is its floor 2/2^5; the bootstrap p is smaller.
  row = report.compare({i: 1.0 + i for i in range(5)}, {i: 0.5 + i for i in range(5)})
  assert row['p'] == pytest.approx(0.0625) and row['p_boot'] < 0.0625 and row['n_pairs'] == 5
