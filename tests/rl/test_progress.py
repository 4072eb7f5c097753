"""Tests of jtc.rl.progress: a population's progress line shows the members' mean and range, lines
come every `every` steps when stderr is not a terminal, and a signal inside `StopOnSignal` only
sets the flag (the loop checkpoints and stops) until the block ends."""
import os
import signal

import pytest

from jtc.rl import progress as progress_lib


def test_progress_summarises_members():
  assert progress_lib.Progress.summary([{'r': 0.5}], 'r') == '0.500'
  assert progress_lib.Progress.summary([{
      'r': 0.2
  }, {
      'r': 0.6
  }, {
      'r': 0.4
  }], 'r') == '0.400 [0.200, 0.600]'


def test_progress_lines_every_n_steps_when_not_a_terminal(capsys):
  progress = progress_lib.Progress(total=5, start=0, every=2)  # pytest's stderr is not a terminal
  for step in range(1, 6):
    progress.update(step, [{'reward_mean': 0.5, 'accuracy': 0.25}] * 2)
  progress.close()
  lines = capsys.readouterr().err.strip().splitlines()
  assert [l.split()[1] for l in lines] == ['2/5', '4/5', '5/5']  # every 2 steps and the last
  assert 'accuracy 0.250 [0.250, 0.250]' in lines[0] and '(2 members: mean [min, max])' in lines[0]
  silent = progress_lib.Progress(total=5, start=0, every=2, show=False)
  silent.update(2, [{'reward_mean': 0.5, 'accuracy': 0.25}])
  assert capsys.readouterr().err == ''


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_block_sets_the_flag_and_the_handler_comes_back(sig):
  before = signal.getsignal(sig)
  with progress_lib.StopOnSignal() as stop:
    assert stop.signal is None
    os.kill(os.getpid(), sig)
    assert stop.signal == sig.name
  assert signal.getsignal(sig) is before


def test_an_evaluation_is_one_line_with_avg_its_error_and_pass_at_k(capsys):
  evals = [{
      'eval/avg@4': 0.5,
      'eval/avg@4_se': 0.02,
      'eval/pass@1': 0.5,
      'eval/pass@4': 0.75,
      'eval/gsm8k/avg@4': 0.6,
      'time_eval': 3.0
  }]
  progress_lib.Progress(10, 0, every=5).evaluation(5, evals)
  assert capsys.readouterr().err == 'eval step 5: avg@4 0.500 (+-0.020) pass@4 0.750\n'
  members = [dict(evals[0]), {**evals[0], 'eval/avg@4': 0.7}]
  progress_lib.Progress(10, 0, every=5).evaluation(5, members)  # a population: mean [min, max]
  assert capsys.readouterr().err.startswith('eval step 5: avg@4 0.600 [0.500, 0.700]')
  progress_lib.Progress(10, 0, every=5, show=False).evaluation(5, evals)  # not process 0: silent
  assert capsys.readouterr().err == ''
