"""Starting one program of a sweep (a population or a single run) and recording how it ended:
one process, N local processes joined by `jax.distributed`, or N started by a cluster launcher
(`Launch`); `launch_program` runs it unless it has finished and writes a failure's detail (exit
status, command, the tail of its stderr) to ``runs/<label>.failed.txt``."""

import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDERR_TAIL_LINES = 25


def _tail(path, n=STDERR_TAIL_LINES):
  if not os.path.exists(path):
    return ''
  with open(path, errors='replace') as f:
    return ''.join(f.readlines()[-n:])


def _why(returncode):
  """Why a program that did not finish stopped, in words."""
  if returncode < 0:
    name = signal.Signals(-returncode).name
    return f'killed by {name}' + (' (the kernel, out of memory?)' if name == 'SIGKILL' else '')
  if returncode > 0:
    return f'exit status {returncode}'
  return 'exit status 0 but a run did not reach its last step'


@dataclasses.dataclass(frozen=True)
class Launch:
  """How a program's processes start: one, or ``processes`` joined by `jax.distributed`
  (`jtc.rl.distributed`), started here on localhost with the JAX_* variables and a free port, or
  by ``prefix``, a cluster launcher that starts them on its nodes (e.g. ``srun -N 2
  --ntasks-per-node=1``; JAX detects SLURM). The members (or, for one member, the batch) are
  sharded over the processes."""
  processes: int = 1
  prefix: tuple = ()

  def mesh_flags(self, num_members):
    if self.processes == 1:
      return []
    axis = 'population' if num_members % self.processes == 0 else 'data'
    return [f'--config.mesh.{axis}={self.processes}']

  def argvs_and_envs(self, command):
    """[(argv, env)] of the processes this launch starts for ``command``."""
    if self.prefix or self.processes == 1:
      return [(list(self.prefix) + command, None)]
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      port = s.getsockname()[1]
    return [(command,
             dict(os.environ, JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                  JAX_NUM_PROCESSES=str(self.processes), JAX_PROCESS_ID=str(i)))
            for i in range(self.processes)]


def launch_program(command, workdir, *, finished, label, results_dir, log, launch=Launch()):
  """Runs ``command`` in ``workdir`` (as ``launch`` says) unless ``finished()``; (None, wall
  seconds so far) or (failure detail, wall) — the detail is also written to
  ``runs/<label>.failed.txt``. Process i > 0 of a local launch logs to ``stderr.<i>.log``."""
  os.makedirs(workdir, exist_ok=True)
  wall_path = os.path.join(workdir, 'runner_wall_time_s')
  wall = float(open(wall_path).read()) if os.path.exists(wall_path) else 0.0
  failed_path = os.path.join(results_dir, 'runs', f'{label}.failed.txt')
  if finished():
    return None, wall
  procs = launch.argvs_and_envs(command)
  log(f'[{label}] start: {shlex.join(procs[0][0])}' +
      (f' ({len(procs)} local processes)' if len(procs) > 1 else ''))
  t0 = time.time()
  with open(os.path.join(workdir, 'stdout.log'), 'a') as out:
    errs = [
        open(os.path.join(workdir, 'stderr.log' if i == 0 else f'stderr.{i}.log'), 'w')
        for i in range(len(procs))
    ]
    running = [
        subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, env=env)
        for (argv, env), err in zip(procs, errs)
    ]
    rcs = [p.wait() for p in running]
    for err in errs:
      err.close()
  rc = next((r for r in rcs if r != 0), 0)
  wall += time.time() - t0
  with open(wall_path, 'w') as f:
    f.write(repr(wall))
  if rc != 0 or not finished():
    detail = f'{_why(rc)}\n$ {shlex.join(command)}\n{_tail(os.path.join(workdir, "stderr.log"))}'
    os.makedirs(os.path.dirname(failed_path), exist_ok=True)
    with open(failed_path, 'w') as f:
      f.write(detail)
    return detail, wall
  if os.path.exists(failed_path):
    os.remove(failed_path)
  return None, wall
