"""The load instrument of the benchmarks (benchmarks/harness.py): a ratio is only reported when
no other process competed for the cores, so the measurement must see another process."""

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
    proc.wait()
  assert other.cores > 0.5 and harness.is_loaded(other)
  assert 'others' in harness.load_str(other)
