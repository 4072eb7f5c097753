"""`jtc sweep` is `python -m experiments.run` under the jtc program name: it finds experiments/
through `absl_program.REPO` (the checkout, or the copy an installed jtc ships) from any working
directory."""
import os
import sys

import pytest

from jtc.cli import absl_program
from jtc.cli import sweep


def test_it_runs_the_experiments_command_from_any_directory(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if p not in ('', absl_program.REPO)])
  with pytest.raises(SystemExit) as e:
    sweep.main(['table1', '--tables-only', '--results-root', str(tmp_path / 'none')])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith('usage: jtc sweep') and 'no run summaries' in err
  assert sys.modules['experiments.run'].__file__.startswith(absl_program.REPO)
  assert os.listdir(tmp_path) == []
