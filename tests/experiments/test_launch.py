"""Tests of experiments.launch: a failed program is reported with the tail of its stderr and its
exit status, the other runs continue."""

from experiments import run as run_lib
from experiments import sweeps as sweeps_lib
from tests.experiments.fake_runs import fake_sweep, fake_command


def test_failed_run_reports_stderr_and_others_continue(tmp_path, monkeypatch):
  sweep = fake_sweep(names=('base', 'broken', 'better'))
  make, _ = fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  rc = run_lib.main(['fake', '--seeds', '2', '--jobs', '2', '--workroot',
                     str(tmp_path / 'w')], make_command=make,
                    results_root=str(tmp_path / 'results'))
  assert rc == 1
  runs_dir = tmp_path / 'results' / 'fake' / 'runs'
  assert sorted(p.name for p in runs_dir.glob('*.json.gz')) == [
      'base__s0.json.gz', 'base__s1.json.gz', 'better__s0.json.gz', 'better__s1.json.gz'
  ]
  md = (tmp_path / 'results' / 'fake.md').read_text()
  assert '## Failed runs' in md and 'something broke in broken' in md
  assert 'exit status 3' in md

  # Rebuilding the same tables leaves the file as it was; rebuilt from nothing, it keeps the
  # sweep's own command (and the failures found on disk) and says which command rebuilt it.
  run_lib.main(['fake', '--tables-only'], make_command=make, results_root=str(tmp_path / 'results'))
  assert (tmp_path / 'results' / 'fake.md').read_text() == md
  (tmp_path / 'results' / 'fake.md').unlink()
  run_lib.main(['fake', '--tables-only'], make_command=make, results_root=str(tmp_path / 'results'))
  md = (tmp_path / 'results' / 'fake.md').read_text()
  assert '- Command: `python -m experiments.run fake --seeds 2 --jobs 2 --workroot' in md
  assert 'rebuilt from the per-run summaries by `python -m experiments.run fake --tables-only`' in md
  assert 'something broke in broken' in md
