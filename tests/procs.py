"""Stopping a trainer process from outside, as a user or a cluster would: a signal sent once a
given checkpoint is on disk (orbax finalises a step by renaming its directory into place)."""
import os
import signal
import subprocess
import time


def kill_after_checkpoint(cmd, workdir, step, *, sig=signal.SIGKILL, cwd=None, env=None,
                          timeout=600):
  """Runs ``cmd``; sends ``sig`` as soon as ``<workdir>/checkpoints/<step>`` exists (the process
  is frozen with SIGSTOP first, so it gets no further). Returns the CompletedProcess-like
  (returncode, stderr); fails if the process ends before that checkpoint appears."""
  ckpt = os.path.join(workdir, 'checkpoints', str(step))
  with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True) as proc:
    deadline = time.time() + timeout
    while not os.path.isdir(ckpt):
      if proc.poll() is not None:
        raise AssertionError(f'{cmd} ended (exit {proc.returncode}) before checkpoint {step}:\n'
                             f'{proc.stderr.read()[-3000:]}')
      if time.time() > deadline:
        proc.kill()
        raise AssertionError(f'no checkpoint {step} in {timeout} s')
      time.sleep(0.02)
    if sig == signal.SIGKILL:
      proc.send_signal(signal.SIGSTOP)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stderr
