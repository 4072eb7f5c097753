"""What every benchmark shares: `--cpu` (before jax is imported), the device line, the load.

Import this module first, before `jax`: `--cpu` in the command line sets JAX_PLATFORMS=cpu;
otherwise JAX picks the best backend it finds (GPU, TPU, else CPU).
"""
import math
import os
import sys
import time

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
  """The 1-minute load average of the host (it counts this benchmark's own threads too)."""
  return os.getloadavg()[0]


# Other processes may keep at most this many cores busy while a timed call runs.
MAX_OTHER_CORES = 0.25


def _host_busy_seconds():
  """CPU seconds all processes of the host have used so far (Linux /proc/stat), else None."""
  try:
    with open('/proc/stat') as f:
      user, nice, system, _, _, irq, softirq, steal = map(int, f.readline().split()[1:9])
  except (OSError, ValueError):
    return None
  return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


def _own_seconds():
  """CPU seconds this process and its finished, waited-for children have used."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


class OtherLoad:
  """``with OtherLoad() as o: ...`` sets ``o.seconds``, the block's wall time, ``o.cores``, the
  cores that OTHER processes kept busy meanwhile (the host's CPU time minus this process's and
  its waited-for children's, e.g. a `subprocess.run` it times, over the wall time; nan without
  /proc/stat), and ``o.load``, the 1-minute load average at the end."""

  def __enter__(self):
    self._start = (_host_busy_seconds(), _own_seconds(), time.perf_counter())
    return self

  def __exit__(self, *exc_info):
    host0, own0, wall0 = self._start
    host1, own1, wall1 = _host_busy_seconds(), _own_seconds(), time.perf_counter()
    self.load = load_average()
    self.seconds = wall1 - wall0
    self.cores = float('nan') if host0 is None else max(0.0, (host1 - host0) -
                                                        (own1 - own0)) / self.seconds


def is_loaded(other: OtherLoad) -> bool:
  """True if other processes competed for the cores (or, without /proc/stat, the load average
  exceeded the host's cores): a timing taken then is not a valid ratio."""
  if math.isnan(other.cores):
    return other.load > (os.cpu_count() or 1)
  return other.cores > MAX_OTHER_CORES


def load_str(other: OtherLoad) -> str:
  """'load 1.9, others 0.02 cores' beside a figure."""
  return f'load {other.load:4.1f}, others {other.cores:4.2f} cores'


def interleaved(calls, rounds, line):
  """Each of ``calls`` ({key: fn()}) once to warm up (compile), then ``rounds`` rounds calling
  each in turn, each call timed with `OtherLoad`: ({key: [seconds per round]}, whether any call
  was loaded); prints ``line(round, key, other)`` after each timed call."""
  for call in calls.values():
    call()
  seconds, loaded = {key: [] for key in calls}, False
  for r in range(rounds):
    for key, call in calls.items():
      with OtherLoad() as other:
        call()
      seconds[key].append(other.seconds)
      loaded |= is_loaded(other)
      print(line(r, key, other))
  return seconds, loaded
