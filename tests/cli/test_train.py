"""Tests of jtc.cli.train, the trainer's command line: every method config is found, and a bad
command line is one line naming what is wrong before anything is computed."""
import os
import subprocess
import sys

import pytest

from jtc.cli import train as train_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = train_cli.methods()


def test_every_method_has_a_config():
  expected = {
      'grpo', 'dapo', 'dr_grpo', 'gspo', 'dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj',
      'grpo_fix', 'delta', 'sapo', 'cispo'
  }
  assert expected <= set(METHODS)


def test_unknown_config_key_on_the_command_line_fails_before_compute(tmp_path):
  proc = subprocess.run([
      sys.executable, '-m', 'jtc.train', '--config=configs/grpo.py:smoke', f'--workdir={tmp_path}',
      '--config.not_a_key=1'
  ], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert 'not_a_key' in proc.stderr
  assert not os.path.exists(os.path.join(tmp_path, 'metrics.jsonl'))


@pytest.mark.parametrize('args,needle', [
    (['--config=configs/nope.py'], "no such config file 'configs/nope.py'; methods: cispo"),
    (['--config=configs/common.py'], 'not a method config'),
    (['--config=configs/sft_arith.py'], 'not a method config'),
    (['--config=configs/gspo.py', '--config.optim.learnin_rate=1'
     ], "unknown config key config.optim.learnin_rate; did you mean 'optim.learning_rate'"),
    (['--config=configs/gspo.py', '--config.log.keep_checkpoints=0'], 'keep_checkpoints=0'),
    (['--config=configs/gspo.py', '--config.rollout.sampling.top_p=0'], 'top_p'),
    (['--config=configs/gspo.py', '--config.policy.init=bse'], "config.policy.init='bse'"),
])
def test_bad_command_lines_fail_in_one_line_before_compute(args, needle, tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'jtc.train', f'--workdir={tmp_path / "w"}', *args],
                        cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert needle in lines[-1] and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / 'w' / 'metrics.jsonl')
