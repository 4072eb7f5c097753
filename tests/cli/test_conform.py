"""Tests of jtc.cli.conform (`jtc conform`): exit 0 when every check passes, 1 when one fails
(the first failing batch saved where asked), and bad input is one line naming the loss or the
value, exit status 2, nothing written."""
import os

import pytest

from jtc import cli


def test_a_correct_loss_exits_0_and_a_buggy_one_1(tmp_path, capsys):
  assert cli.main([
      'conform', '--loss', 'jtc.interop.plain_losses:grpo', '--objective', 'grpo', '--aggregation',
      'seq_mean_token_mean', '--accumulation', 'sum'
  ]) == 0
  assert capsys.readouterr().out.strip().endswith('result: PASS: every check')
  save = str(tmp_path / 'first.npz')
  assert cli.main([
      'conform', '--loss', 'tests.interop.buggy_losses:ratio_stop_gradient', '--objective', 'grpo',
      '--aggregation', 'seq_mean_token_mean', '--save', save
  ]) == 1
  out = capsys.readouterr().out
  assert 'FAIL weights' in out and f'first failing batch saved: {save}' in out
  assert os.path.exists(save)


@pytest.mark.parametrize('args, message', [
    (['--loss', 'no_such_pkg_xyz:f'], 'cannot import no_such_pkg_xyz (ModuleNotFoundError'),
    (['--loss', 'tests.interop.test_conform_grad:per_row'
     ], 'returned an array of shape (16,), not a scalar loss'),
    (['--loss', 'tests.interop.test_conform_grad:pair'], 'returned a tuple, not a scalar loss'),
    (['--objective', 'ppo'], "--objective 'ppo' is not valid; valid: ["),
    (['--aggregation', 'mean'], "--aggregation 'mean' is not valid; valid: ["),
    (['--framework', 'mlx'], "--framework 'mlx' is not valid; valid: torch, jax, numpy"),
    (['--accumulation', 'max'], "--accumulation 'max' is not valid; valid: mean, sum"),
    (['--hparams', 'eps_low=-1'], 'eps_low=-1 must be > 0'),
    (['--hparams', 'eps_low'], "--hparams 'eps_low': expected key=value"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
  save = str(tmp_path / 'first.npz')
  base = {
      '--loss': 'jtc.interop.plain_losses:grpo',
      '--objective': 'grpo',
      '--aggregation': 'seq_mean_token_mean'
  }
  base.update(dict(zip(args[::2], args[1::2])))
  argv = ['conform', '--save', save] + [x for kv in base.items() for x in kv]
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1 and 'Traceback' not in err
  assert not os.path.exists(save)
