"""Tests of experiments/run.py, the command line: an unknown sweep lists the valid ones, a resized
sweep never touches the committed results, a sweep run in parts lists its parts, and (slow) the
--smoke form of every sweep end to end with the real trainer."""
import dataclasses
import json

import pytest

from experiments import common
from experiments import report
from experiments import run as run_lib
from experiments import schedule
from experiments import summaries
from experiments import sweeps as sweeps_lib
from tests.experiments.fake_runs import fake_sweep, fake_command, launches


def test_unknown_sweep_lists_the_valid_ones(capsys):
  with pytest.raises(ValueError, match=r"unknown sweep 'nope'.*table1"):
    sweeps_lib.get_sweep('nope')
  with pytest.raises(SystemExit) as e:
    run_lib.main(['nope', '--tables-only'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "'nope'" in err and all(name in err for name in sweeps_lib.SWEEPS)


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


def test_a_resized_sweep_never_touches_the_committed_results(tmp_path, monkeypatch):
  """The try-out of issue 15: `--num-steps 1 --seeds 1` once overwrote an 80-step sweep's
  summaries and results file. Resized sweeps go to scratch/, a summary with other settings is
  refused without --replace, and an invocation that runs nothing new leaves the file as is."""
  sweep = fake_sweep(num_steps=4)
  make, counter = fake_command(tmp_path)
  monkeypatch.setattr(
      sweeps_lib, 'get_sweep', lambda *a, num_steps=None, **k:
      (dataclasses.replace(sweep, num_steps=num_steps) if num_steps else sweep))
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  root = tmp_path / 'results'
  args = ['fake', '--jobs', '2', '--workroot', str(tmp_path / 'w')]
  assert run_lib.main(args, make_command=make, results_root=str(root)) == 0
  canonical = {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json.gz')}
  md = (root / 'fake.md').read_bytes()
  # A quick try-out with another num_steps: written under scratch/, nothing canonical changes.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1'], make_command=make,
                      results_root=str(root)) == 0
  assert (root / 'scratch' / 'fake' / 'runs' / 'base__s0.json.gz').exists()
  assert {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json.gz')} == canonical
  assert (root / 'fake.md').read_bytes() == md
  # Forced into the canonical root, it is refused run by run instead of replacing them.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1', '--canonical'], make_command=make,
                      results_root=str(root)) == 1
  assert {p.name: p.read_bytes() for p in (root / 'fake' / 'runs').glob('*.json.gz')} == canonical
  # Re-running the sweep as defined with fewer seeds runs nothing and rewrites nothing.
  n = len(launches(counter))
  assert run_lib.main(args + ['--seeds', '1'], make_command=make, results_root=str(root)) == 0
  assert len(launches(counter)) == n
  # --replace is the explicit request that may replace a summary.
  assert run_lib.main(args + ['--num-steps', '1', '--seeds', '1', '--canonical', '--replace'],
                      make_command=make, results_root=str(root)) == 0
  assert common.read_summary(str(root / 'fake' / 'runs' / 'base__s0.json.gz'))['num_steps'] == 1


def test_a_sweep_run_in_parts_runs_each_part_once_and_lists_the_parts(tmp_path, monkeypatch):
  sweep = fake_sweep(num_steps=4)
  make, counter = fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  root = tmp_path / 'results'
  args = ['fake', '--jobs', '2', '--seeds', '2', '--workroot', str(tmp_path / 'w')]
  with pytest.raises(SystemExit):  # an unknown run is refused before anything runs
    run_lib.main(args + ['--runs', 'base,nope'], make_command=make, results_root=str(root))
  assert launches(counter) == []
  assert run_lib.main(args + ['--runs', 'base'], make_command=make, results_root=str(root)) == 0
  assert sorted(launches(counter)) == ['base', 'base']
  assert 'BETTER' in (root / 'fake.md').read_text()  # the tables cover the whole sweep
  assert run_lib.main(args, make_command=make, results_root=str(root)) == 0
  assert sorted(launches(counter)) == ['base', 'base', 'better', 'better']
  parts = json.loads((root / 'fake' / 'invocation.json').read_text())['parts']
  assert [p['command'].endswith('--runs base') for p in parts] == [True, False]
  assert all(p['wall_time_s'] >= 0 for p in parts)
  old = dict(command='old', wall_time_s=1.0)  # the single-invocation file of earlier revisions
  assert report.invocation_parts(old) == [old]


def test_tables_only_rewrites_nothing_that_would_not_change_and_refuses_an_empty_table(
    tmp_path, monkeypatch, capsys):
  """A rebuild from the same summaries leaves the results file and its curves byte for byte (a
  clean checkout stays clean); one from changed summaries writes; a folder without summaries
  (e.g. the working directory of an installed jtc) is refused, and nothing is created."""
  sweep = fake_sweep(num_steps=4)
  make, _ = fake_command(tmp_path)
  monkeypatch.setattr(sweeps_lib, 'get_sweep', lambda *a, **k: sweep)
  monkeypatch.setattr(sweeps_lib, 'SWEEPS', {'fake': None})
  root = tmp_path / 'results'
  args = ['fake', '--jobs', '2', '--seeds', '1', '--workroot', str(tmp_path / 'w')]
  assert run_lib.main(args, make_command=make, results_root=str(root)) == 0
  md, png = root / 'fake.md', root / 'fake' / 'curves.png'
  before = md.read_bytes(), png.read_bytes()
  assert run_lib.main(['fake', '--tables-only'], results_root=str(root)) == 0
  assert 'up to date' in capsys.readouterr().out
  assert (md.read_bytes(), png.read_bytes()) == before
  # Known positive: a summary removed changes the tables, and the file is rewritten.
  next((root / 'fake' / 'runs').glob('better__*')).unlink()
  assert run_lib.main(['fake', '--tables-only'], results_root=str(root)) == 0
  assert md.read_bytes() != before[0] and '--tables-only' in md.read_text()
  with pytest.raises(SystemExit) as e:
    run_lib.main(['fake', '--tables-only'], results_root=str(tmp_path / 'elsewhere'))
  assert e.value.code == 2 and 'no run summaries' in capsys.readouterr().err
  assert not (tmp_path / 'elsewhere').exists()
