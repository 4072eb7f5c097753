"""`jtc eval`'s command line (jtc.cli.eval): bad input is one line before any compute (the
evaluation itself: tests/rl/test_checkpoint_eval.py)."""
import pytest

from jtc.cli import eval as eval_cli


@pytest.mark.parametrize('argv,match', [
    (['--dataset', 'arithmetic'], 'the following arguments are required: --checkpoint'),
    (['--checkpoint', 'base', '--dataset', 'arithmetic', '--config.optim.nope=1'
     ], 'unknown config key config.optim.nope'),
    (['--checkpoint', 'base', '--dataset', '/no/such/data'], 'is not a dataset jtc reads'),
    (['--checkpoint', 'base', '--dataset', 'arithmetic', '--bogus'], 'unrecognized arguments'),
])
def test_bad_input_is_one_line(argv, match, capsys):
  with pytest.raises(SystemExit) as e:
    eval_cli.main(argv)
  assert e.value.code != 0 and match in capsys.readouterr().err + str(e.value.code)
