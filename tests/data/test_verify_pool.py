"""The verifier pool (jtc.data.verify_pool): scores in order, a hanging check scored 0 within its
timeout and its worker replaced, a crashing worker replaced, no process left after close() or
after its parent dies.

The checks the workers run are this module's functions (a worker imports this module by name).
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jtc.data import verify_pool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG = 'hang'  # a completion on which `hanging_check` sleeps for an hour
# A hung check must come back within its timeout plus this (process kill + restart), far below
# the hour a hanging check would take.
SLACK_S = 30.0


def equal_check(completion, answer):
  """1.0 iff the completion is the answer."""
  return float(completion == answer)


def hanging_check(completion, answer):
  """`equal_check`, but it sleeps for an hour on `HANG` (a pathological answer)."""
  if completion == HANG:
    time.sleep(3600)
  return equal_check(completion, answer)


def crashing_check(completion, answer):
  """`equal_check`, but the process dies on 'crash'."""
  if completion == 'crash':
    os._exit(3)  # pylint: disable=protected-access
  return equal_check(completion, answer)


def noisy_check(completion, answer):
  """`equal_check` that also prints to stdout (the protocol's channel, were it not redirected)."""
  print('1.0\nready')
  return equal_check(completion, answer)


def raising_check(completion, answer):
  """`equal_check`, but raises on 'raise'."""
  if completion == 'raise':
    raise ValueError('bad answer')
  return equal_check(completion, answer)


def alive(pid):
  """Whether a process with this id exists (and is not a zombie)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[-1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def _pairs(n):
  """n (completion, answer) pairs, every third one wrong, and their scores by hand."""
  completions = [str(i) for i in range(n)]
  answers = [str(i + 1) if i % 3 == 0 else str(i) for i in range(n)]
  return completions, answers, np.asarray([float(i % 3 != 0) for i in range(n)], np.float32)


@pytest.mark.parametrize('check', [equal_check, noisy_check])
def test_scores_come_back_in_order(check):
  completions, answers, expected = _pairs(11)  # more answers than workers
  with verify_pool.VerifierPool(check, workers=2, timeout_s=60) as pool:
    np.testing.assert_array_equal(pool.score(completions, answers), expected)
    np.testing.assert_array_equal(pool.score(completions[::-1], answers[::-1]), expected[::-1])
    assert pool.score([], []).shape == (0,)
    assert pool.timeouts == 0


def test_a_hanging_check_scores_zero_within_its_timeout_and_its_worker_is_replaced():
  completions, answers, expected = _pairs(6)
  completions[2] = answers[2] = HANG  # known positive: equal, so 1.0 if it ever returned
  expected[2] = 0.0
  with verify_pool.VerifierPool(hanging_check, workers=2, timeout_s=1.0) as pool:
    before = pool.pids
    start = time.monotonic()
    scores = pool.score(completions, answers)
    blocked = time.monotonic() - start
    np.testing.assert_array_equal(scores, expected)
    assert blocked < pool.timeout_s + SLACK_S, blocked
    assert pool.timeouts == 1
    killed = set(before) - set(pool.pids)
    assert len(killed) == 1 and len(pool.pids) == 2
    assert not any(alive(pid) for pid in killed)
    # The pool goes on with its replacement worker.
    np.testing.assert_array_equal(pool.score(['a', 'b'], ['a', 'c']), [1.0, 0.0])


def test_a_crashing_worker_scores_zero_and_is_replaced():
  with verify_pool.VerifierPool(crashing_check, workers=1, timeout_s=60) as pool:
    np.testing.assert_array_equal(pool.score(['a', 'crash', 'b'], ['a', 'crash', 'b']),
                                  [1.0, 0.0, 1.0])
    assert pool.timeouts == 0 and len(pool.pids) == 1


def test_workers_outlive_a_ctrl_c_to_the_process_group():
  """SIGINT and SIGTERM are the trainer's: a worker keeps working through them."""
  with verify_pool.VerifierPool(equal_check, workers=1, timeout_s=60) as pool:
    pids = pool.pids
    for sig in (signal.SIGINT, signal.SIGTERM):
      os.kill(pids[0], sig)
    np.testing.assert_array_equal(pool.score(['a', 'b'], ['a', 'c']), [1.0, 0.0])
    assert pool.pids == pids and alive(pids[0])


def test_a_raising_check_scores_zero():
  with verify_pool.VerifierPool(raising_check, workers=1, timeout_s=60) as pool:
    np.testing.assert_array_equal(pool.score(['raise', 'b'], ['raise', 'b']), [0.0, 1.0])


def test_close_ends_every_worker_and_is_idempotent():
  pool = verify_pool.VerifierPool(equal_check, workers=3, timeout_s=60)
  pids = pool.pids
  assert len(pids) == 3 and all(alive(pid) for pid in pids)  # known positive for `alive`
  pool.close()
  assert not any(alive(pid) for pid in pids)
  pool.close()
  with pytest.raises(RuntimeError, match='closed'):
    pool.score(['a'], ['a'])


def test_workers_exit_when_their_parent_is_killed(tmp_path):
  """A parent that never calls close() (killed) leaves no worker behind."""
  code = ('import sys, time; from jtc.data import verify_pool; from tests.data import '
          'test_verify_pool as t; pool = verify_pool.VerifierPool(t.hanging_check, workers=2, '
          'timeout_s=60); print(*pool.pids, flush=True); pool.score([t.HANG], [t.HANG])')
  parent = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
  pids = [int(p) for p in parent.stdout.readline().split()]
  assert len(pids) == 2 and all(alive(pid) for pid in pids)
  parent.kill()
  parent.wait()
  deadline = time.monotonic() + 30
  while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not any(alive(pid) for pid in pids)


def test_bad_settings_and_checks_are_refused():
  with pytest.raises(ValueError, match='workers=0'):
    verify_pool.VerifierPool(equal_check, workers=0, timeout_s=1)
  with pytest.raises(ValueError, match='timeout_s=0'):
    verify_pool.VerifierPool(equal_check, workers=1, timeout_s=0)
  with pytest.raises(ValueError, match='module-level function'):
    verify_pool.VerifierPool(lambda c, a: 1.0, workers=1, timeout_s=1)
  assert verify_pool.check_name(equal_check) == 'tests.data.test_verify_pool:equal_check'


def test_a_worker_that_cannot_start_is_an_error():
  with pytest.raises(RuntimeError, match='exited before it was ready'):
    verify_pool.VerifierPool(no_such_check, workers=1, timeout_s=1)


def no_such_check(completion, answer):
  """Named by a module the workers cannot import (its __module__ is changed below)."""
  return equal_check(completion, answer)


no_such_check.__module__ = 'tests.data.no_such_module'
