"""Trainer processes started by tests. Each child's whole stderr goes to a file; a failure names
that file and quotes its first error lines and its tail (an abort's message comes before the
thread dump that follows it, so a tail alone can miss it). `kill_after_checkpoint` stops a
trainer from outside, as a user or a cluster would: a signal sent once a given checkpoint is on
disk (orbax finalises a step by renaming its directory into place)."""
import dataclasses
import os
import re
import signal
import subprocess
import time

# The first lines of what went wrong: a Python traceback or error line, absl/XLA's F/E lines
# (e.g. 'F0000 ... Check failed', 'E0000 ... Terminating process'), faulthandler's header.
ERROR_LINE = re.compile(r'^(Traceback|\S*(Error|error|Exception):|[FE]\d{4} |Fatal Python error|'
                        r'\*\*\* |terminate called)')


@dataclasses.dataclass(frozen=True, repr=False)
class Ended:
  """A finished child: its exit status, stdout, the file holding its whole stderr, and that
  stderr. Its repr (what a failed assert shows) says how it ended, names the file and quotes
  the error lines and the tail."""
  cmd: list
  returncode: int
  stdout: str
  log: str

  @property
  def stderr(self):
    with open(self.log, errors='replace') as f:
      return f.read()

  def __repr__(self):
    lines = self.stderr.splitlines()
    errors = [l for l in lines if ERROR_LINE.match(l)][:12]
    how = (f'killed by {signal.Signals(-self.returncode).name}'
           if self.returncode < 0 else f'exit status {self.returncode}')
    return '\n'.join([
        f'{" ".join(map(str, self.cmd))}: {how}; its whole stderr ({len(lines)} lines) is in '
        f'{self.log}', 'first error lines:', *errors, '... last lines:', *lines[-30:]
    ])


def start(cmd, log, **popen_kw):
  """``subprocess.Popen(cmd)`` with its stderr written to the file ``log`` (stdout piped)."""
  with open(log, 'w') as err:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, **popen_kw)
  proc.log = str(log)
  return proc


def wait(proc, timeout=600):
  """`Ended` of a process from `start`."""
  out, _ = proc.communicate(timeout=timeout)
  return Ended(proc.args, proc.returncode, out, proc.log)


def run(cmd, log, *, timeout=600, **popen_kw):
  """`Ended` of ``cmd`` run to its end, its stderr in ``log``."""
  return wait(start(cmd, log, **popen_kw), timeout)


def kill_after_checkpoint(cmd, workdir, step, *, sig=signal.SIGKILL, log=None, cwd=None, env=None,
                          timeout=600):
  """Runs ``cmd``; sends ``sig`` as soon as ``<workdir>/checkpoints/<step>`` exists (the process
  is frozen with SIGSTOP first, so it gets no further). Returns its `Ended` (stderr in ``log``,
  default ``<workdir>.killed.log``); fails if it ends before that checkpoint appears."""
  ckpt = os.path.join(workdir, 'checkpoints', str(step))
  proc = start(cmd, log or f'{workdir.rstrip(os.sep)}.killed.log', cwd=cwd, env=env)
  deadline = time.time() + timeout
  while not os.path.isdir(ckpt):
    if proc.poll() is not None:
      raise AssertionError(f'ended before checkpoint {step}: {wait(proc)}')
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f'no checkpoint {step} in {timeout} s: {wait(proc)}')
    time.sleep(0.02)
  if sig == signal.SIGKILL:
    proc.send_signal(signal.SIGSTOP)
  proc.send_signal(sig)
  return wait(proc, timeout)


def offline_wandb_env(folder, environ=None):
  """``environ`` (default: this process's) for W&B runs that never reach the network: offline,
  silent, without credentials (an empty netrc), W&B's settings and caches under ``folder``, and
  its own W&B service (not one this process started: a child killed in a test would leave its
  run marked in use there)."""
  os.makedirs(folder, exist_ok=True)
  netrc = os.path.join(folder, 'netrc')
  open(netrc, 'a').close()
  env = {
      k: v
      for k, v in (os.environ if environ is None else environ).items()
      if k not in ('WANDB_API_KEY', 'WANDB_IDENTITY_TOKEN_FILE', 'WANDB_BASE_URL', 'WANDB_SERVICE')
  }
  env.update(WANDB_MODE='offline', WANDB_SILENT='true', NETRC=netrc,
             WANDB_CONFIG_DIR=os.path.join(folder,
                                           'config'), WANDB_CACHE_DIR=os.path.join(folder, 'cache'),
             WANDB_DATA_DIR=os.path.join(folder, 'data'),
             WANDB_ARTIFACT_DIR=os.path.join(folder, 'artifacts'))
  return env
