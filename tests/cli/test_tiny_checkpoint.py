"""`jtc tiny-checkpoint`'s command line (jtc.cli.tiny_checkpoint): an OUT with files is refused and
left as it is, an unknown architecture names the valid ones."""
import pytest

from jtc.cli import tiny_checkpoint as cli


def test_the_command_refuses_a_directory_with_files(tmp_path, capsys):
  (tmp_path / 'mine.txt').write_text('x')
  with pytest.raises(SystemExit) as e:
    cli.main([str(tmp_path), '--like', 'qwen3'])
  assert e.value.code == 2 and 'not an empty directory' in capsys.readouterr().err
  assert [p.name for p in tmp_path.iterdir()] == ['mine.txt']
  with pytest.raises(SystemExit):
    cli.main([str(tmp_path / 'new'), '--like', 'gpt2'])  # argparse names the valid choices
  assert "choose from 'llama', 'qwen2', 'qwen3', 'qwen3_5', 'qwen3_next'" in capsys.readouterr().err
