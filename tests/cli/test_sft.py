"""Tests of jtc.cli.sft (`jtc sft`): its flags, and a bad config or override named before anything
runs. An SFT run itself is tests/rl/test_sft_trainer.py's step and `jtc sft --config
configs/sft_arith.py:smoke` (docs/training.md)."""
from absl import flags
import pytest

from jtc.cli import absl_program
from jtc.cli import sft


def test_the_flags_parse_the_config_and_its_overrides():
  argv = ['jtc sft', '--config=configs/sft_arith.py:smoke', '--workdir=W', '--config.num_steps=3']
  fv = flags.FlagValues()
  assert sft.define_flags(fv, argv) == ['config', 'workdir']
  fv(argv)
  assert fv.config.num_steps == 3 and fv.config.batch_size == 8 and fv.workdir == 'W'


@pytest.mark.parametrize('argv', [
    ['--config=configs/sft_arith.py:smok', '--workdir=W'],
    ['--config=configs/sft_arith.py', '--workdir=W', '--config.num_stesp=3'],
])
def test_a_bad_config_is_one_line_before_anything_runs(argv, capsys, monkeypatch):
  monkeypatch.chdir(absl_program.REPO)
  fv = flags.FlagValues()
  sft.define_flags(fv, ['jtc sft', *argv])
  with pytest.raises(SystemExit) as exit_info:
    absl_program.parse_flags(['jtc sft', *argv], fv)
  assert str(exit_info.value.code).startswith('error: ')
  assert ('smok' in str(exit_info.value.code)) or "did you mean 'num_steps'" in str(
      exit_info.value.code)
