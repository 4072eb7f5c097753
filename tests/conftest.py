"""Shared pytest set-up: CPU only, float32 matmuls, deterministic, XLA:CPU's cheap code
generation, a compilation cache of the session's own; a smoke run with a ledger for the ledger's
tests (jtc.analysis.ledger, replay, ledger_view; jtc.cli.ledger)."""
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
# The tests' programs are tiny, so compiling them costs far more than running them: LLVM's
# cheapest code generation for XLA:CPU (the HLO passes and buffer assignment are XLA's own and
# unchanged; floating-point rounding may differ in the last bits from an optimised build) makes
# a trainer test about 1.5x faster on the 2-core CI machine. A subprocess a test starts
# inherits it; the multi-device children append their device count to it.
CHEAP_CODEGEN = ('--xla_backend_optimization_level=0', '--xla_llvm_disable_expensive_passes=true')
os.environ['XLA_FLAGS'] = ' '.join(
    [f for f in CHEAP_CODEGEN if f not in os.environ.get('XLA_FLAGS', '')] +
    [os.environ.get('XLA_FLAGS', '')]).strip()
# A persistent compilation cache of this session's own (one per xdist worker, removed at the
# end): a trainer started in a subprocess, or a second Trainer built in-process, loads the
# executable an earlier test compiled from the same program instead of compiling it again. Only
# compilations over a second are stored (JAX's default), and an unreadable entry is recompiled.
_JAX_CACHE_DIR = tempfile.mkdtemp(prefix='jtc_test_jax_cache_')
os.environ['JAX_COMPILATION_CACHE_DIR'] = _JAX_CACHE_DIR

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')


def pytest_unconfigure(config):
  del config
  shutil.rmtree(_JAX_CACHE_DIR, ignore_errors=True)


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
