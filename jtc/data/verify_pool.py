"""A pool of verifier processes with a per-answer timeout: a check that hangs scores 0, never
stalls training.

``VerifierPool(check, workers=4, timeout_s=10.0)`` starts ``workers`` Python processes once
(``python -m jtc.data.verify_pool MODULE:FUNCTION``); ``pool.score(completions, answers)`` sends
the answers one at a time to idle workers and returns ``check(completion, answer)`` of each as a
``[B]`` float32 array (``pool.score_items(items)``: ``check(*item)`` of each JSON list ``item``).
With ``setup`` (a JSON list) a worker calls ``check(*setup)`` once and scores with the function
it returns (e.g. a user's reward function loaded by name). An answer whose check has not returned
``timeout_s`` after it was sent scores 0: its worker is killed (SIGKILL) and a fresh one started
in its place; a worker that dies mid-check scores that answer 0 the same way. A check that raises,
or returns what is not a finite number, scores 0 too; every such answer of the last call is in
``pool.errors`` (row -> one line saying why), so a caller can count and report them. ``pool.close()`` (or leaving a ``with`` block) ends
every worker and waits for it. Workers ignore SIGINT and SIGTERM (a Ctrl-C reaches the whole
process group; the trainer finishes its step with them) and exit within a second of their
parent's death.

Why processes started by ``subprocess`` and not ``multiprocessing``: the trainer has jax loaded
(multi-threaded), so the workers must not be forked from it; ``subprocess`` execs a fresh
interpreter at once, and unlike a ``spawn`` context it does not import the parent's ``__main__``
(``jtc.train``, with jax) in every worker. Timeouts are the parent's: a worker's own code runs
without signal-based alarms, so it may be any thread-unsafe verifier.

Protocol (one JSON value per line): the worker prints ``"ready"`` once ``check`` is imported and
has checked ``WARM_UP`` (so lazily imported libraries load outside any answer's timeout);
then for each JSON list of arguments on its stdin it prints ``[score, null]``, or ``[0.0, "why"]``
when the check raised or returned no finite number. End of its stdin ends it; a worker whose
parent has died exits within a second (its parent id changes).

POSIX only (``select`` on pipes, ``os.getppid``), like the rest of jtc's process handling.

Dimension key (docs/dimensions.md): B answers scored in one call.
"""
from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Callable, Sequence

import numpy as np

from jtc import checks

# A worker must report ready (its imports done) within this many seconds.
START_TIMEOUT_S = 120.0
# The (completion, answer) a worker checks once before it reports ready.
WARM_UP = ('\\boxed{0}', '0')
# How long close() waits for a worker to exit at the end of its stdin before killing it.
CLOSE_WAIT_S = 5.0


def check_name(check: Callable) -> str:
  """``'module:function'`` of a module-level function (what a worker imports)."""
  module, name = getattr(check, '__module__', None), getattr(check, '__qualname__', '')
  if not module or module == '__main__' or not name or '.' in name or '<' in name:
    raise ValueError(f'a pool check must be a module-level function of an importable module, '
                     f'got {check!r}')
  return f'{module}:{name}'


def _import_check(name: str) -> Callable:
  module, _, function = name.partition(':')
  return getattr(importlib.import_module(module), function)


def as_score(value) -> float:
  """``value`` as a finite float; TypeError naming what it is otherwise (a string, None, NaN)."""
  if isinstance(value, (bool, int, float, np.integer, np.floating)) and np.isfinite(value):
    return float(value)
  raise TypeError(f'returned {type(value).__name__} {value!r:.60}, not a finite number')


class _Worker:
  """One worker process; ``pending``: (row, deadline) of the answer it is checking, or None."""

  def __init__(self, check: str, setup: str):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    self.proc = subprocess.Popen([sys.executable, '-m', 'jtc.data.verify_pool', check, setup],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    self.ready, self.pending, self._buffer = False, None, b''
    self.started = time.monotonic()

  def send(self, row: int, item: Sequence, deadline: float) -> None:
    self.proc.stdin.write((json.dumps(list(item)) + '\n').encode())
    self.proc.stdin.flush()
    self.pending = (row, deadline)

  def read_lines(self) -> list | None:
    """The complete lines now readable (JSON values); None at end of file (the worker died)."""
    data = os.read(self.proc.stdout.fileno(), 1 << 16)
    if not data:
      return None
    self._buffer += data
    *lines, self._buffer = self._buffer.split(b'\n')
    return [json.loads(line) for line in lines if line.strip()]

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:  # a broken pipe's buffered bytes have nowhere to go
        pass


def _kill_all(workers: list) -> None:
  for w in workers:
    w.kill()


class VerifierPool:
  """``workers`` verifier processes running ``check(completion, answer) -> float`` (a
  module-level function; with ``setup``, the function ``check(*setup)`` returns, called with each
  item's arguments); see the module docstring. Not thread-safe: call ``score`` from one thread.
  ``timeouts``: how many answers have timed out so far; ``errors``: row -> why, for each answer
  of the last call scored 0 by a failure (raised, not a number, timed out, worker died)."""

  def __init__(self, check: Callable, *, workers: int, timeout_s: float, setup: Sequence = ()):
    checks.positive_int('workers', workers)
    checks.positive('timeout_s', timeout_s)
    self.check, self.timeout_s, self.timeouts = check_name(check), float(timeout_s), 0
    self.setup, self.errors = json.dumps(list(setup)), {}
    self._workers: list[_Worker] = []
    self._finalizer = weakref.finalize(self, _kill_all, self._workers)
    self._selector = selectors.DefaultSelector()
    self.closed = False
    try:
      for _ in range(workers):
        self._start_worker()
      while not all(w.ready for w in self._workers):
        self._wait(None, time.monotonic() + START_TIMEOUT_S)
    except BaseException:
      self.close()
      raise

  @property
  def pids(self) -> list[int]:
    """The process ids of the current workers."""
    return [w.proc.pid for w in self._workers]

  def _start_worker(self) -> None:
    w = _Worker(self.check, self.setup)
    self._workers.append(w)
    self._selector.register(w.proc.stdout, selectors.EVENT_READ, w)

  def _replace(self, w: _Worker) -> None:
    self._selector.unregister(w.proc.stdout)
    self._workers.remove(w)
    w.kill()
    self._start_worker()

  def _wait(self, scores_B, start_deadline) -> None:
    """Handles what the workers have said or failed to say by the earliest deadline: scores,
    ready lines, deaths, timeouts."""
    now = time.monotonic()
    deadlines = [w.pending[1] for w in self._workers if w.pending]
    deadlines += [w.started + START_TIMEOUT_S for w in self._workers if not w.ready]
    timeout = max(0.0, min(deadlines, default=start_deadline) - now)
    for key, _ in self._selector.select(timeout):
      w = key.data
      lines = w.read_lines()
      if lines is None:  # the worker died
        if not w.ready:
          raise RuntimeError(f'a verifier worker ({self.check}) exited before it was ready '
                             f'(exit status {w.proc.wait()}); its error is above')
        what = 'while idle' if w.pending is None else f'checking answer {w.pending[0]} (scored 0)'
        if w.pending is not None:
          self.errors[w.pending[0]] = 'its worker process died'
        print(f'verify_pool: a worker died {what}; started another', file=sys.stderr)
        self._replace(w)
        continue
      for value in lines:
        if value == 'ready':
          w.ready = True
        elif w.pending is not None:
          scores_B[w.pending[0]], error = value
          if error is not None:
            self.errors[w.pending[0]] = error
          w.pending = None
    now = time.monotonic()
    for w in list(self._workers):
      if w.pending is not None and now >= w.pending[1]:
        self.timeouts += 1
        self.errors[w.pending[0]] = f'took over {self.timeout_s:g} s (timed out)'
        print(
            f'verify_pool: answer {w.pending[0]} took over {self.timeout_s:g} s to check (scored '
            f'0); its worker was killed and another started', file=sys.stderr)
        self._replace(w)
      elif not w.ready and now >= w.started + START_TIMEOUT_S:
        raise RuntimeError(f'a verifier worker ({self.check}) was not ready after '
                           f'{START_TIMEOUT_S:g} s')

  def score(self, completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """[B] float32: ``check(completion, answer)`` of each pair, 0 for one that failed."""
    if len(completions) != len(answers):
      raise ValueError(f'completions and answers must have equal length, got '
                       f'{len(completions)}, {len(answers)}')
    return self.score_items([(str(c), str(a)) for c, a in zip(completions, answers)])

  def score_items(self, items: Sequence[Sequence]) -> np.ndarray:
    """[B] float32: the check of each item (a JSON-serialisable list of its arguments), 0 for one
    that failed (``errors`` then says why)."""
    if self.closed:
      raise RuntimeError('the verifier pool is closed')
    scores_B = np.zeros(len(items), np.float32)
    self.errors = {}
    todo = list(range(len(items)))[::-1]
    while todo or any(w.pending for w in self._workers):
      for w in self._workers:
        if todo and w.ready and w.pending is None:
          row = todo.pop()
          try:
            w.send(row, items[row], time.monotonic() + self.timeout_s)
          except OSError:  # died while idle: not this answer's doing, so it goes to another
            todo.append(row)
            self._replace(w)
            break
      self._wait(scores_B, time.monotonic() + START_TIMEOUT_S)
    return scores_B

  def close(self) -> None:
    """Ends every worker (end of its stdin, then SIGKILL after ``CLOSE_WAIT_S``) and waits for
    it. Idempotent."""
    if self.closed:
      return
    self.closed = True
    for w in self._workers:
      try:
        w.proc.stdin.close()
      except OSError:
        pass
    deadline = time.monotonic() + CLOSE_WAIT_S
    for w in self._workers:
      try:
        w.proc.wait(max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
      w.kill()
    self._workers.clear()
    self._selector.close()
    self._finalizer.detach()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()


# ------------------------------------------------------------------------------- the worker


def _exit_with_parent(parent: int) -> None:
  while True:
    time.sleep(1.0)
    if os.getppid() != parent:
      os._exit(0)  # pylint: disable=protected-access


def worker_main(check: str, setup: str = '[]') -> None:
  """A worker's loop: JSON lists of arguments in, ``[score, error]`` lines out (``[0.0, why]``
  when the check raises or returns no finite number); ``setup``: JSON arguments of a factory
  ``check`` (none: ``check`` scores, after a warm-up on `WARM_UP`)."""
  threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
  # Ctrl-C or a SIGTERM to the process group is the trainer's to handle (it finishes the step,
  # checkpoints and closes the pool); a worker ends with its stdin, its parent, or SIGKILL.
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
  fn = _import_check(check)
  out = os.fdopen(os.dup(1), 'w')  # the protocol's channel; what the check prints goes to stderr
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  setup_args = json.loads(setup)
  if setup_args:  # a user's function, loaded once (its import errors end the worker, unready)
    fn = fn(*setup_args)
  else:
    try:  # libraries the check imports lazily load now, outside any answer's timeout
      fn(*WARM_UP)
    except Exception:  # pylint: disable=broad-except
      pass
  out.write('"ready"\n')
  out.flush()
  for line in sys.stdin:
    try:
      value, error = as_score(fn(*json.loads(line))), None
    except Exception as e:  # pylint: disable=broad-except
      value, error = 0.0, f'{type(e).__name__}: {e}'.splitlines()[0][:200]
    out.write(json.dumps([value, error]) + '\n')
    out.flush()


if __name__ == '__main__':
  worker_main(*sys.argv[1:])
