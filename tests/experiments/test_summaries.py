"""Tests of experiments.summaries: --refresh-curves re-reads a curve the summaries did not keep,
all or nothing; --compress rewrites plain summaries as .json.gz and the tables stay the same."""
import json
import os

import pytest

from experiments import common
from experiments import run as run_lib
from experiments import summaries
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
  full = {p.name: common.read_summary(str(p)) for p in runs_dir.glob('*.json.gz')}
  for name, summary in full.items():  # as summarised before 'asym' was a kept curve
    curves = {k: v for k, v in summary['curves'].items() if k != 'asym'}
    summaries.write_json(str(runs_dir / name), dict(summary, curves=curves))
  lost = tmp_path / 'lost.jsonl'
  os.replace(os.path.join(full['base__s0.json.gz']['workdir'], 'metrics.jsonl'), lost)
  refresh = ['fake', '--tables-only', '--refresh-curves']
  assert run_lib.main(refresh, results_root=results) == 1  # base__s0's metrics are gone
  assert all(
      'asym' not in common.read_summary(str(p))['curves'] for p in runs_dir.glob('*.json.gz'))
  os.replace(lost, os.path.join(full['base__s0.json.gz']['workdir'], 'metrics.jsonl'))
  assert run_lib.main(refresh, results_root=results) == 0
  assert {p.name: common.read_summary(str(p)) for p in runs_dir.glob('*.json.gz')} == full
  with pytest.raises(SystemExit):
    run_lib.main(argv + ['--refresh-curves'], make_command=make, results_root=results)


def test_compress_keeps_every_summary_and_the_tables(tmp_path, monkeypatch):
  """Plain summaries (as written before jtc 0.2) and their .json.gz rewrite give the same tables;
  a run with both forms is refused by name; compressing twice changes nothing."""
  sweep = fake_sweep()
  make, _ = fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  results = str(tmp_path / 'results')
  argv = ['fake', '--jobs', '2', '--workroot', str(tmp_path / 'w')]
  assert run_lib.main(argv, make_command=make, results_root=results) == 0
  runs_dir = tmp_path / 'results' / 'fake' / 'runs'
  full = {p.name[:-len('.gz')]: common.read_summary(str(p)) for p in runs_dir.glob('*.json.gz')}
  for name, summary in full.items():  # the pre-0.2 layout
    (runs_dir / name).write_text(json.dumps(summary, indent=1))
    os.remove(runs_dir / (name + '.gz'))
  md_path = tmp_path / 'results' / 'fake.md'
  strip = lambda text: [l for l in text.splitlines() if 'Tables rebuilt' not in l]
  assert run_lib.main(['fake', '--tables-only'], results_root=results) == 0
  plain_md = strip(md_path.read_text())
  with pytest.raises(SystemExit):  # it rewrites summaries: only with --tables-only
    run_lib.main(argv + ['--compress'], make_command=make, results_root=results)
  assert run_lib.main(['fake', '--tables-only', '--compress'], results_root=results) == 0
  assert sorted(p.name for p in runs_dir.iterdir()) == sorted(n + '.gz' for n in full)
  assert {p.name[:-len('.gz')]: common.read_summary(str(p)) for p in runs_dir.iterdir()} == full
  assert strip(md_path.read_text()) == plain_md
  gz_bytes = {p.name: p.read_bytes() for p in runs_dir.iterdir()}
  assert summaries.compress(str(tmp_path / 'results' / 'fake')) == 0
  assert {p.name: p.read_bytes() for p in runs_dir.iterdir()} == gz_bytes
  (runs_dir / 'base__s0.json').write_text('{}')
  with pytest.raises(ValueError, match='two summaries of run .base__s0.'):
    common.load_summaries(str(tmp_path / 'results' / 'fake'))
