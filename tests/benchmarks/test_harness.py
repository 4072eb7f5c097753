"""The load instrument of the benchmarks (benchmarks/harness.py): a ratio is only reported when
no other process competed for the cores, so the measurement must see another process, and not the benchmark's own subprocesses."""

import subprocess
import sys
import time

import pytest

from benchmarks import harness


@pytest.mark.skipif(harness._host_busy_seconds() is None, reason='needs /proc/stat (Linux)')  # pylint: disable=protected-access
def test_other_load_sees_another_process_busy_during_the_call():
  spin = 'import time\nt = time.time()\nwhile time.time() - t < 1.5: pass'
  with harness.OtherLoad() as other:
    proc = subprocess.Popen([sys.executable, '-c', spin])  # another process busy for 1.5 s
    time.sleep(1.0)
  proc.wait()  # reaped after the block: not a child the block waited for
  assert other.cores > 0.5 and harness.is_loaded(other)
  assert 'others' in harness.load_str(other)


def test_a_child_the_timed_block_runs_and_waits_for_is_its_own_work():
  work = 'import time\nsum(range(10 ** 7))\nprint(time.process_time())'  # fixed CPU work
  before = harness._own_seconds()  # pylint: disable=protected-access
  child = subprocess.run([sys.executable, '-c', work], check=True, capture_output=True, text=True)
  after = harness._own_seconds()  # pylint: disable=protected-access
  # Not counted as its own, it would be read as another process's load.
  assert after - before >= float(child.stdout) - 0.02


def test_interleaved_warms_up_then_alternates_the_calls_each_round(capsys):
  order = []
  calls = {'a': lambda: order.append('a'), 'b': lambda: order.append('b')}
  seconds, loaded = harness.interleaved(calls, 3, lambda r, key, other: f'round {r} {key}')
  assert order == ['a', 'b'] * 4  # one warm-up call each, then 3 rounds
  assert {k: len(v) for k, v in seconds.items()} == {'a': 3, 'b': 3}
  assert isinstance(loaded, bool)
  assert capsys.readouterr().out.split('\n')[:2] == ['round 0 a', 'round 0 b']
