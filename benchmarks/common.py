"""What every benchmark shares: `--cpu` (before jax is imported), the device line, load average.

Import this module first, before `jax`: `--cpu` in the command line sets JAX_PLATFORMS=cpu;
otherwise JAX picks the best backend it finds (GPU, TPU, else CPU).
"""
import os
import sys

if '--cpu' in sys.argv:
  os.environ['JAX_PLATFORMS'] = 'cpu'


def add_cpu_flag(parser):
  """The `--cpu` flag (read from sys.argv at import time; declared here for --help)."""
  parser.add_argument('--cpu', action='store_true',
                      help='force the CPU backend (default: whatever backend JAX finds)')


def device_line() -> str:
  """'backend=gpu device=NVIDIA H100 80GB HBM3 x1' (the devices this run uses)."""
  import jax  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  return (f'backend={jax.default_backend()} device={devices[0].device_kind} x{len(devices)} '
          f'(host cores: {os.cpu_count()})')


def load_average() -> float:
  """The 1-minute load average of the host."""
  return os.getloadavg()[0]


def cores_used() -> int:
  """Host cores a run may use (XLA:CPU and torch use them all)."""
  return os.cpu_count() or 1


def load_note(load: float) -> str:
  """'' on a quiet host, else the warning that makes a ratio invalid."""
  return f'  LOADED: not a valid ratio (load {load:.1f} > {cores_used()} cores)' if (
      load > cores_used()) else ''
