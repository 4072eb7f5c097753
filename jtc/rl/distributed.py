"""Multi-process training: every process runs the same program on its share of the work, JAX's
multi-controller runtime (`jax.distributed`) joins them into one set of devices.

  JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i python -m jtc.train ...

`initialize` starts the runtime, first thing in every process, before any other JAX work:
  * from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (or the same as
    arguments): all three must be given, and a start that fails is an error saying why, never a
    single-process run;
  * else from a cluster that JAX detects (SLURM with several tasks, Open MPI with several ranks,
    a Cloud TPU pod slice), an error likewise if it fails;
  * else a single process (nothing was asked for).
On CPU the processes' collectives go through gloo. A process that dies is noticed by the others
through the runtime's heartbeat (``heartbeat_timeout_s``): they stop with the runtime's error
instead of waiting forever in a collective.

`check_agreement` then compares every process's config and code revision (all-gathered) and
fails fast naming the keys that differ. `is_primary` says which process writes the workdir's
lock, metrics, logs and progress; every process writes its shards of a checkpoint (orbax).
"""

import hashlib
import json
import os
import subprocess
import sys

import jax
import numpy as np

ENV_KEYS = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')
# A process that stops answering for this long stops the others ($JTC_HEARTBEAT_S overrides).
HEARTBEAT_S = int(os.environ.get('JTC_HEARTBEAT_S', '30'))


class DistributedError(RuntimeError):
  """A multi-process start or agreement check that failed (named, with what to do)."""


def detected_cluster(environ=None):
  """The cluster JAX would auto-detect from the environment ('SLURM', 'Open MPI', 'Cloud TPU'),
  when it spans several processes; None otherwise."""
  env = os.environ if environ is None else environ
  if 'SLURM_JOB_ID' in env and int(env.get('SLURM_NTASKS', '1')) > 1:
    return 'SLURM'
  if int(env.get('OMPI_COMM_WORLD_SIZE', '1')) > 1:
    return 'Open MPI'
  if len([h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1:
    return 'Cloud TPU'
  return None


def requested(environ=None, **given):
  """{'coordinator_address', 'num_processes', 'process_id'} from ``given`` (not None) or the
  environment; a DistributedError naming what is missing when only some are set."""
  env = os.environ if environ is None else environ
  names = ('coordinator_address', 'num_processes', 'process_id')
  values = {
      n: given.get(n) if given.get(n) is not None else env.get(k) for n, k in zip(names, ENV_KEYS)
  }
  if not any(v is not None and v != '' for v in values.values()):
    return None
  missing = [k for n, k in zip(names, ENV_KEYS) if values[n] in (None, '')]
  if missing:
    raise DistributedError(f'multi-process training needs {", ".join(ENV_KEYS)}; {missing} '
                           'not set (set all three, or none for one process)')
  try:
    num, pid = int(values['num_processes']), int(values['process_id'])
  except ValueError:
    raise DistributedError(f'JAX_NUM_PROCESSES={values["num_processes"]!r} and JAX_PROCESS_ID='
                           f'{values["process_id"]!r} must be integers') from None
  if not 0 <= pid < num:
    raise DistributedError(f'JAX_PROCESS_ID={pid} is not in [0, JAX_NUM_PROCESSES={num})')
  return dict(coordinator_address=str(values['coordinator_address']), num_processes=num,
              process_id=pid)


def initialize(*, environ=None, timeout_s=300, heartbeat_timeout_s=HEARTBEAT_S, **given):
  """Starts the multi-process runtime when asked (module docstring); returns the number of
  processes. Raises DistributedError with the reason when a requested start fails."""
  asked = requested(environ, **given)
  cluster = None if asked else detected_cluster(environ)
  if asked is None and cluster is None:
    return 1
  # CPU devices' collectives across processes (affects only the CPU client; no backend may be
  # touched before the runtime starts).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  where = (f'coordinator {asked["coordinator_address"]}, process {asked["process_id"]} of '
           f'{asked["num_processes"]}' if asked else f'the {cluster} cluster')
  try:
    jax.distributed.initialize(**(asked or {}), initialization_timeout=timeout_s,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except Exception as e:  # pylint: disable=broad-except
    raise DistributedError(f'could not start multi-process training ({where}): '
                           f'{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}') from e
  if asked and jax.process_count() != asked['num_processes']:
    raise DistributedError(
        f'started {jax.process_count()} processes, {asked["num_processes"]} asked')
  return jax.process_count()


def is_primary():
  """Whether this process writes what a run writes once (lock, metrics, logs, progress)."""
  return jax.process_index() == 0


def code_revision():
  """The git revision of jtc's checkout, with '+dirty' and a hash of the changes (so that two
  processes running different uncommitted code differ), or the package version."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, text=True,
                         check=True).stdout.strip()
    diff = subprocess.run(['git', 'diff', 'HEAD'], cwd=root, capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    from importlib import metadata  # pylint: disable=import-outside-toplevel
    return f'jtc {metadata.version("jtc")}'
  return sha + (f'+dirty-{hashlib.sha1(diff).hexdigest()[:10]}' if diff else '')


def _allgather_text(text):
  """Every process's ``text`` (a list in process order): lengths first, then padded bytes."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  data = np.frombuffer(text.encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int32)))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:len(data)] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [bytes(row[:n]).decode() for row, n in zip(gathered, lengths.ravel())]


def check_agreement(config_dict):
  """DistributedError naming the keys (or the code revision) on which any process differs from
  process 0; nothing when there is one process."""
  if jax.process_count() == 1:
    return
  from jtc import checks  # pylint: disable=import-outside-toplevel
  mine = json.dumps({'config': config_dict, 'revision': code_revision()}, sort_keys=True)
  every = [json.loads(t) for t in _allgather_text(mine)]
  first = every[0]
  for pid, other in enumerate(every[1:], start=1):
    if other == first:
      continue
    a, b = checks.flatten(first['config']), checks.flatten(other['config'])
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    diff = '; '.join(
        f'{k}: {a.get(k, "(absent)")!r} (process 0) vs {b.get(k, "(absent)")!r}' for k in keys[:6])
    if other['revision'] != first['revision']:
      diff = (diff + '; ' if diff else '') + (f'code revision {first["revision"]} (process 0) vs '
                                              f'{other["revision"]}')
    raise DistributedError(f'process {pid} runs another configuration than process 0 ({diff}); '
                           'every process must run the same command on the same code')
  print(f'{jax.process_count()} processes agree on the config and code revision', file=sys.stderr)


def any_process(flag):
  """Whether ``flag`` is true in any process (every process must call it: a collective)."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(np.asarray(multihost_utils.process_allgather(np.array([bool(flag)]))).any())
