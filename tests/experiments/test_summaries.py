"""Tests of experiments.summaries: --refresh-curves re-reads a curve the summaries did not keep,
all or nothing."""
import json
import os

import pytest

from experiments import run as run_lib
from experiments import sweeps as sweeps_lib
from tests.experiments.fake_runs import fake_sweep, fake_command


def test_refresh_curves_rereads_a_curve_the_summaries_did_not_keep(tmp_path, monkeypatch):
  """Summaries written before a curve was kept (the mismatch sweep's correction/* once) get it
  back from the runs' metrics.jsonl; all or nothing, and only with --tables-only."""
  sweep = fake_sweep()
  make, _ = fake_command(tmp_path)
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
