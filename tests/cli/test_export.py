"""`jtc export`'s command line (jtc.cli.export): a workdir without a run is one line naming it
(the export itself: tests/rl/test_export.py)."""
import pytest

from jtc.cli import export as export_cli


def test_a_workdir_without_a_run_is_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    export_cli.main([str(tmp_path), str(tmp_path / 'out')])
  assert e.value.code == 2 and 'holds no run' in capsys.readouterr().err
  assert not (tmp_path / 'out').exists()
