"""Shared pytest set-up: CPU only, float32 matmuls, deterministic; a smoke run with a ledger for
the ledger's tests (jtc.analysis.ledger, replay, ledger_view; jtc.cli.ledger)."""
import os
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
