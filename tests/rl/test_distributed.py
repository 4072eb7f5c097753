"""Multi-process training (jtc.rl.distributed): two processes on localhost, one CPU device each,
gloo collectives. They train exactly as one process with two devices on the same mesh; a killed
process stops the other (the runtime's heartbeat) and the run resumes from its checkpoint; a
population sharded over the two processes is the same population in one process; processes
that disagree fail fast naming the difference; a partial environment is an error."""
import os
import re
import signal
import socket
import sys
import time

import numpy as np
import pytest

from tests import procs
from jtc.analysis import metric_writer
from jtc.analysis import tracking
from jtc.rl import distributed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# mismatch/* measure float rounding between the sampler and the trainer (~1e-6): another device
# layout rounds otherwise.
NONDETERMINISTIC = ('time_', 'tokens_per_s', 'mismatch/')
BASE = ['--config=configs/gspo.py:smoke', '--config.num_steps=3']


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(devices=1, base=None, **extra):
  env = dict(base or os.environ, JAX_PLATFORMS='cpu', JTC_HEARTBEAT_S='10', **extra)
  flags = [f for f in env.get('XLA_FLAGS', '').split() if 'device_count' not in f]
  env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={devices}'])
  return env


def _start(workdir, *flags, port, extra=((), ()), attempt='', base=None):
  """The two processes of a run, started together (``extra``: each one's own flags; ``base``:
  their environment, default this process's); process i's stderr goes to
  ``<workdir>.stderr<attempt>.<i>.log``."""
  return [
      procs.start([sys.executable, '-m', 'jtc.train', *BASE, f'--workdir={workdir}', *flags, *more],
                  f'{workdir}.stderr{attempt}.{i}.log', cwd=REPO,
                  env=_env(base=base, JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                           JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(i)))
      for i, more in enumerate(extra)
  ]


def _wait(started, timeout=600):
  return [procs.wait(p, timeout) for p in started]


def _one(workdir, *flags, devices):
  ended = procs.run([sys.executable, '-m', 'jtc.train', *BASE, f'--workdir={workdir}', *flags],
                    f'{workdir}.stderr.log', cwd=REPO, env=_env(devices))
  assert ended.returncode == 0, ended


def _metrics(workdir):
  return [[{
      k: v
      for k, v in r.items()
      if not k.startswith(NONDETERMINISTIC)
  }
           for r in metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))]
          for d in metric_writer.run_dirs(workdir)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for ra_list, rb_list in zip(a, b):
    assert [r['step'] for r in ra_list] == [r['step'] for r in rb_list] == [0, 1, 2, 3]
    for ra, rb in zip(ra_list, rb_list):
      assert ra.keys() == rb.keys()
      for k in ('reward_mean', 'accuracy', 'response_length'):  # identical rollouts
        if k in ra:
          assert ra[k] == rb[k], k
      for k in ra:
        # Loss and grad norm within 1e-5, the rest within 1e-4 (a wrong member or batch would
        # move every metric by O(1)).
        tol = 1e-5 if k in ('loss', 'grad_norm', 'pg_loss', 'update_norm') else 1e-4
        np.testing.assert_allclose(ra[k], rb[k], rtol=tol, atol=1e-5, err_msg=f'{ra["step"]} {k}')


@pytest.mark.slow  # 2-6 min on 2 cores
def test_two_processes_equal_one_process_and_resume_after_a_kill(tmp_path):
  reference, run = str(tmp_path / 'one'), str(tmp_path / 'two')
  _one(reference, '--config.mesh.data=2', devices=2)
  started = _start(run, '--config.mesh.data=2', port=_free_port())
  ckpt = os.path.join(run, 'checkpoints', '1')
  deadline = time.time() + 600
  while not os.path.isdir(ckpt) and time.time() < deadline and started[1].poll() is None:
    time.sleep(0.05)
  started[1].send_signal(signal.SIGKILL)
  survivor, killed = _wait(started, timeout=300)
  assert killed.returncode == -9, killed
  assert survivor.returncode != 0, survivor  # the survivor stops, it does not hang
  assert distributed.PEER_LOST in survivor.stderr, survivor
  results = _wait(_start(run, '--config.mesh.data=2', port=_free_port(), attempt='-resumed'))
  for ended in results:
    assert ended.returncode == 0, ended
  assert 'resumed from step' in results[0].stderr
  _assert_same(_metrics(reference), _metrics(run))


@pytest.mark.slow  # 2 min; CI runs the two-process test above
def test_a_population_over_two_processes_is_the_population_of_one_process(tmp_path):
  members = ['--config.population.size=2']
  one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
  _one(one, *members, devices=1)
  # With W&B on (offline): process 0 alone logs, one W&B run per member.
  wandb = procs.offline_wandb_env(str(tmp_path / 'wandb_env'))
  results = _wait(
      _start(two, *members, '--config.mesh.population=2', '--config.log.wandb_project=jtc-tests',
             port=_free_port(), base=wandb))
  for ended in results:
    assert ended.returncode == 0, ended
  assert "'population': 2" in results[0].stderr
  _assert_same(_metrics(one), _metrics(two))
  assert 'W&B:' in results[0].stderr and 'W&B:' not in results[1].stderr
  for d in metric_writer.run_dirs(two):
    assert len([n for n in os.listdir(os.path.join(d, 'wandb')) if n.startswith('offline-run-')
               ]) == 1
    assert tracking.offline_history(d) == [{
        'step': r['step'],
        **tracking.for_wandb(r)
    } for r in metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))]


def test_processes_that_disagree_fail_fast_naming_the_difference(tmp_path):
  results = _wait(
      _start(str(tmp_path / 'w'), port=_free_port(),
             extra=([], ['--config.optim.learning_rate=0.5'])), timeout=300)
  assert all(r.returncode != 0 for r in results), results
  assert any(
      'optim.learning_rate' in r.stderr and 'process 1' in r.stderr for r in results), ('\n'.join(
          map(str, results)))
  assert not os.path.exists(tmp_path / 'w' / 'metrics.jsonl')


@pytest.mark.parametrize('env, match', [
    ({
        'JAX_NUM_PROCESSES': '2'
    }, "needs JAX_COORDINATOR_ADDRESS.*'JAX_COORDINATOR_ADDRESS'"),
    ({
        'JAX_COORDINATOR_ADDRESS': 'h:1',
        'JAX_NUM_PROCESSES': '2',
        'JAX_PROCESS_ID': '2'
    }, r'JAX_PROCESS_ID=2 is not in \[0, JAX_NUM_PROCESSES=2\)'),
    ({
        'JAX_COORDINATOR_ADDRESS': 'h:1',
        'JAX_NUM_PROCESSES': 'two',
        'JAX_PROCESS_ID': '0'
    }, 'must be integers'),
] + [({
    'JAX_COORDINATOR_ADDRESS': bad,
    'JAX_NUM_PROCESSES': '2',
    'JAX_PROCESS_ID': '1'
}, f'JAX_COORDINATOR_ADDRESS={bad!r} is not host:port')
     for bad in ('localhost', 'h:http', ':1234', 'h:0', 'h:65536')])
def test_a_partial_or_bad_environment_is_an_error(env, match):
  with pytest.raises(distributed.DistributedError, match=match):
    distributed.requested(env)  # at once: nothing is tried on the network


@pytest.mark.parametrize('jtc', [pytest.param(True, marks=pytest.mark.slow), False])
def test_an_unreachable_coordinator_fails_within_the_timeout_naming_it(tmp_path, jtc):
  """Process 1 of 2 with nothing at the coordinator's port: jtc retries until the (shortened)
  timeout, then one line names the address, the process and the time waited. Control: JAX's own
  start aborts with a C++ stack trace (what the check below must be able to see)."""
  address = f'127.0.0.1:{_free_port()}'
  cmd = ([
      sys.executable, '-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={tmp_path}'
  ] if jtc else [
      sys.executable, '-c',
      'import jax, os; jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], 2, 1, '
      'initialization_timeout=1)'
  ])
  ended = procs.run(
      cmd, tmp_path / 'stderr.log', cwd=REPO, timeout=120,
      env=_env(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='1',
               JTC_COORDINATOR_TIMEOUT_S='2'))
  assert ended.returncode != 0, ended
  c_trace = 'Check failure stack trace' in ended.stderr or 'Fatal Python error' in ended.stderr
  assert c_trace != jtc, ended
  if jtc:
    assert ended.returncode == 1 and 'Traceback' not in ended.stderr, ended
    waited = re.search(
        rf'process 1 of 2 at coordinator {address} after (\d+) s \(timeout 2 s\): '
        'the last connection attempt failed: Connection refused', ended.stderr)
    assert waited and int(waited[1]) >= 2, ended  # it kept trying until the timeout
    assert 'Check that all JAX_NUM_PROCESSES processes' in ended.stderr


def test_process_0_whose_port_is_taken_is_named_as_such():
  with socket.socket() as taken:
    taken.bind(('', 0))
    taken.listen()
    port = taken.getsockname()[1]
    asked = distributed.requested({
        'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port}',
        'JAX_NUM_PROCESSES': '2',
        'JAX_PROCESS_ID': '0'
    })
    with pytest.raises(
        distributed.DistributedError,
        match=rf'process 0 of 2 at coordinator 127.0.0.1:{port} .*port {port} '
        'is taken by another program'):
      distributed.meet(asked, 60, environ={})
  asked['process_id'] = 1  # control: the same address for process 1 is not about a port taken
  with pytest.raises(distributed.DistributedError, match='Connection refused'):
    distributed.meet(asked, 0.5, environ={})


@pytest.mark.parametrize('configured, env, expected', [
    (0, {}, distributed.TIMEOUT_S),
    (0, {
        'JTC_COORDINATOR_TIMEOUT_S': '7.5'
    }, 7.5),
    (20, {
        'JTC_COORDINATOR_TIMEOUT_S': '7.5'
    }, 20),
    (-1, {}, 'config.distributed.coordinator_timeout_s=-1 must be'),
    (0, {
        'JTC_COORDINATOR_TIMEOUT_S': '0'
    }, r"\$JTC_COORDINATOR_TIMEOUT_S='0' must be"),
    (0, {
        'JTC_COORDINATOR_TIMEOUT_S': 'ten'
    }, r"\$JTC_COORDINATOR_TIMEOUT_S='ten' must be"),
])
def test_the_coordinator_timeout_comes_from_the_config_then_the_environment(
    configured, env, expected):
  if isinstance(expected, str):
    with pytest.raises(distributed.DistributedError, match=expected):
      distributed.coordinator_timeout_s(configured, env)
  else:
    assert distributed.coordinator_timeout_s(configured, env) == expected


def test_no_environment_is_one_process_and_clusters_are_detected():
  assert distributed.requested({}) is None
  assert distributed.detected_cluster({}) is None
  assert distributed.detected_cluster({'SLURM_JOB_ID': '1', 'SLURM_NTASKS': '4'}) == 'SLURM'
  assert distributed.detected_cluster({'SLURM_JOB_ID': '1', 'SLURM_NTASKS': '1'}) is None
  assert distributed.detected_cluster({'OMPI_COMM_WORLD_SIZE': '2'}) == 'Open MPI'
  assert distributed.detected_cluster({'TPU_WORKER_HOSTNAMES': 'a,b'}) == 'Cloud TPU'
