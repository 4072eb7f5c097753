"""A smoke run with a ledger, shared by the ledger's tests."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='session')
def run_with_ledger(tmp_path_factory):
  """A smoke GSPO run of 2 steps with a ledger every step (2 updates per step)."""
  workdir = str(tmp_path_factory.mktemp('ledger_run'))
  cmd = [
      sys.executable, '-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={workdir}',
      '--config.log.ledger_every=1'
  ]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir
