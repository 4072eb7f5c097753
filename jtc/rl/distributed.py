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
Before the runtime starts, the processes meet on the coordinator's port (`jtc.rl.rendezvous`)
within ``coordinator_timeout_s``: an unreachable coordinator, a process that never starts, a
taken port or a malformed address is an error naming the address, the process, how long it
waited and what to check (JAX's runtime would instead abort minutes later saying that "another
task died"). On CPU the processes' collectives go through gloo.

A process that dies later is noticed by the others: a collective under way fails at once, and
`exit_when_a_peer_is_lost` turns that into one message and an immediate exit; otherwise the
runtime's heartbeat (``heartbeat_timeout_s``) aborts them with XLA's "Terminating process"
message and a C++ stack trace, which jtc cannot intercept (the start-up line says so).

`check_agreement` then compares every process's config and code revision (all-gathered) and
fails fast naming the keys that differ. `is_primary` says which process writes the workdir's
lock, metrics, logs and progress; every process writes its shards of a checkpoint (orbax).
"""

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import traceback

import jax
import numpy as np

from jtc.rl import rendezvous
from jtc.rl import sharding

ENV_KEYS = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')
# A process that stops answering for this long stops the others ($JTC_HEARTBEAT_S overrides).
HEARTBEAT_S = int(os.environ.get('JTC_HEARTBEAT_S', '30'))
# How long the processes have to meet at start-up: config.distributed.coordinator_timeout_s,
# else $JTC_COORDINATOR_TIMEOUT_S, else this.
TIMEOUT_ENV, TIMEOUT_S = 'JTC_COORDINATOR_TIMEOUT_S', 300
TIMEOUT_HINT = ('Check that all JAX_NUM_PROCESSES processes were started with the same '
                'JAX_COORDINATOR_ADDRESS and each its own JAX_PROCESS_ID, that process 0 runs on '
                'the host the address names, and that its port is reachable from the others '
                '(firewall); a slower start needs a longer --config.distributed.'
                f'coordinator_timeout_s or ${TIMEOUT_ENV}')
PEER_LOST = 'lost contact with another process'


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
  try:
    rendezvous.parse_address(values['coordinator_address'])
  except rendezvous.RendezvousError as e:
    raise DistributedError(str(e)) from None
  return dict(coordinator_address=str(values['coordinator_address']), num_processes=num,
              process_id=pid)


def coordinator_timeout_s(configured=0, environ=None):
  """Seconds the processes have to meet at start-up: ``configured``
  (config.distributed.coordinator_timeout_s) when not 0, else $JTC_COORDINATOR_TIMEOUT_S, else
  300; a DistributedError naming a value that is not a number of seconds > 0."""
  env = os.environ if environ is None else environ
  for name, value in (('config.distributed.coordinator_timeout_s', configured),
                      (f'${TIMEOUT_ENV}', env.get(TIMEOUT_ENV))):
    if not value:  # 0, '' or None: not given ('0' is given, and refused)
      continue
    try:
      seconds = float(value)
    except (TypeError, ValueError):
      seconds = math.nan
    if not seconds > 0:
      raise DistributedError(f'{name}={value!r} must be a number of seconds > 0')
    return seconds
  return TIMEOUT_S


def meet(asked, timeout_s, environ=None):
  """The processes' rendezvous on the coordinator's port (`jtc.rl.rendezvous`), before JAX's
  runtime starts; a DistributedError naming the address, this process, the time waited and
  what to check when it fails."""
  env = os.environ if environ is None else environ
  address, pid, num = asked['coordinator_address'], asked['process_id'], asked['num_processes']
  host, port = rendezvous.parse_address(address)
  t0 = time.monotonic()
  try:
    if pid == 0:
      bind = env.get('JAX_COORDINATOR_BIND_ADDRESS')
      rendezvous.wait_for_all(host, port, num_processes=num, deadline=t0 + timeout_s,
                              bind_host=rendezvous.parse_address(bind)[0] if bind else '')
    else:
      rendezvous.join(host, port, process_id=pid, num_processes=num, deadline=t0 + timeout_s)
  except rendezvous.RendezvousError as e:
    raise DistributedError(
        f'multi-process start failed for process {pid} of {num} at coordinator {address} after '
        f'{time.monotonic() - t0:.0f} s (timeout {timeout_s:g} s): {e}. {TIMEOUT_HINT}.') from None


def initialize(*, environ=None, timeout_s=0, heartbeat_timeout_s=HEARTBEAT_S, **given):
  """Starts the multi-process runtime when asked (module docstring; ``timeout_s``: see
  `coordinator_timeout_s`); returns the number of processes. Raises DistributedError with the
  reason when a requested start fails."""
  sharding.reserve_cpu_threads(environ)  # before JAX's CPU client exists
  asked = requested(environ, **given)
  cluster = None if asked else detected_cluster(environ)
  if asked is None and cluster is None:
    return 1
  timeout_s = coordinator_timeout_s(timeout_s, environ)
  if asked:  # a detected cluster's address is JAX's to find: no rendezvous there
    meet(asked, timeout_s, environ)
  # CPU devices' collectives across processes (affects only the CPU client; no backend may be
  # touched before the runtime starts).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  where = (f'coordinator {asked["coordinator_address"]}, process {asked["process_id"]} of '
           f'{asked["num_processes"]}' if asked else f'the {cluster} cluster')
  try:
    jax.distributed.initialize(**(asked or {}), initialization_timeout=math.ceil(timeout_s),
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except Exception as e:  # pylint: disable=broad-except
    raise DistributedError(f'could not start multi-process training ({where}): '
                           f'{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}') from e
  if asked and jax.process_count() != asked['num_processes']:
    raise DistributedError(
        f'started {jax.process_count()} processes, {asked["num_processes"]} asked')
  print(
      f'process {jax.process_index()} of {jax.process_count()} joined ({where}). If another '
      f'process dies, this one stops: with "{PEER_LOST}" when a collective was under way, else '
      f'within ~{heartbeat_timeout_s} s ($JTC_HEARTBEAT_S) by XLA\'s abort "Terminating process '
      'because the JAX distributed service detected fatal errors" (a C++ stack trace follows): '
      'the other processes\' logs say why it died', file=sys.stderr, flush=True)
  return jax.process_count()


@contextlib.contextmanager
def exit_when_a_peer_is_lost():
  """Within the block, a JAX runtime error of a multi-process run (in practice a collective
  that failed because another process died) prints its traceback and one line saying so, then
  exits at once with status 1: leaving normally would wait in JAX's shutdown barrier for the
  dead process and end in XLA's abort after the heartbeat timeout."""
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if jax.process_count() == 1:
      raise
    traceback.print_exc()
    print(
        f'error: process {jax.process_index()} of {jax.process_count()} {PEER_LOST}: a '
        f'collective failed ({str(e).strip().splitlines()[0][:300]}). Another process most '
        'likely died (its log says why); this one exits now instead of waiting for the '
        'runtime\'s heartbeat. Start every process again with the same command to resume from '
        'the last checkpoint.', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # pylint: disable=protected-access


def is_primary():
  """Whether this process writes what a run writes once (lock, metrics, logs, progress)."""
  return jax.process_index() == 0


def code_revision(exclude=()):
  """The git revision of jtc's checkout, with '+dirty' and a hash of the changes (so that two
  processes running different uncommitted code differ), or the package version. ``exclude``:
  paths whose changes do not count (e.g. the docs a run itself writes)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, text=True,
                         check=True).stdout.strip()
    diff = subprocess.run(['git', 'diff', 'HEAD', '--', '.', *(f':(exclude){p}' for p in exclude)],
                          cwd=root, capture_output=True, check=True).stdout
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
