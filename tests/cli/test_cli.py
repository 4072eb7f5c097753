"""`jtc <command>`: the dispatcher of jtc.cli runs each command's `main`, the console script is
installed, and bad input is named before anything runs."""
import importlib.metadata

import pytest

from jtc import cli


def test_the_console_script_is_the_dispatcher():
  scripts = importlib.metadata.entry_points(group='console_scripts')
  assert [s.value for s in scripts if s.name == 'jtc'] == ['jtc.cli:main']


def test_without_a_command_it_prints_the_commands_and_fails(capsys):
  assert cli.main([]) == 2
  err = capsys.readouterr().err
  assert all(name in err for name in cli.COMMANDS)
  assert cli.main(['--help']) == 0 and 'ledger' in capsys.readouterr().out


def test_an_unknown_command_is_named_with_the_valid_ones(capsys):
  assert cli.main(['trian', '--config', 'configs/gspo.py']) == 2
  assert "unknown command 'trian'; valid: train, sft, ledger, plot" in capsys.readouterr().err


@pytest.mark.parametrize('flag', ['--help', '-h'])
@pytest.mark.parametrize('name', list(cli.COMMANDS))
def test_each_command_is_its_module_main_under_the_jtc_program_name(name, flag, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main([name, flag])
  out = capsys.readouterr().out
  assert exit_info.value.code in (0, None) and out.startswith(f'usage: jtc {name}')
  if hasattr(cli.command_module(name), 'define_flags'):  # absl: the command's flags alone
    assert '--config' in out
    assert ('--workdir' in out) == (name != 'plan') and ('--topology' in out) == (name == 'plan')
    assert ('allow_config_change' in out) == (name == 'train')


def test_a_bad_config_path_is_one_line_before_anything_runs():
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['train', '--config=configs/nope.py', '--workdir=/tmp/x'])
  assert "no such config file 'configs/nope.py'" in str(exit_info.value.code)
