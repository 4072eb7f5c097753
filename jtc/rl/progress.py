"""What the training loop shows while it runs and how it stops: progress lines (`Progress`) on a
terminal or in logs, and Ctrl-C / SIGTERM ending the loop after a checkpoint (`StopOnSignal`)."""

import signal
import sys
import time

import numpy as np
from tqdm import tqdm


class StopOnSignal:
  """Within the block, SIGINT / SIGTERM only set ``signal`` (the loop checkpoints and stops);
  a second one stops at once. The previous handlers come back on exit."""

  def __enter__(self):
    self.signal, self._old = None, {}
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._old[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.signal:  # a second signal: the default behaviour
      signal.signal(signum, self._old[signum])
      signal.raise_signal(signum)
    self.signal = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._old.items():
      signal.signal(sig, handler)


class Progress:
  """A tqdm bar on a terminal; else (nohup, cluster logs) one line every ``every`` steps with
  step, reward, accuracy, steps/s and the time left. A population's line shows the members'
  mean and [min, max]."""

  def __init__(self, total, start, *, every, show=True):
    self.total, self.start, self.t0 = total, start, time.perf_counter()
    self.show = show
    self.every = every if show else 0
    self.bar = None
    if show and sys.stderr.isatty():
      self.bar = tqdm(total=total, initial=start, desc='rl', dynamic_ncols=True, file=sys.stderr)

  @staticmethod
  def summary(metrics, key):
    """'0.512' for one run; '0.512 [0.450, 0.580]' (mean [min, max]) for a population."""
    values = [m[key] for m in metrics]
    if len(values) == 1:
      return f'{values[0]:.3f}'
    return f'{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]'

  def update(self, step, metrics):
    """``metrics``: the step's metrics of each member (a list of one for a run)."""
    reward, acc = self.summary(metrics, 'reward_mean'), self.summary(metrics, 'accuracy')
    if self.bar is not None:
      self.bar.update(1)
      self.bar.set_postfix(reward=reward, acc=acc)
    elif self.every and (step % self.every == 0 or step == self.total):
      rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
      eta = (self.total - step) / max(rate, 1e-9)
      members = f' ({len(metrics)} members: mean [min, max])' if len(metrics) > 1 else ''
      print(
          f'step {step}/{self.total} reward {reward} accuracy {acc} '
          f'{rate:.2f} steps/s ETA {eta / 60:.1f} min{members}', file=sys.stderr, flush=True)

  def evaluation(self, step, evals):
    """One line per evaluation (``evals``: each member's ``eval/*`` metrics): avg@k with its
    sampling error and pass@k, e.g. ``eval step 50: avg@4 0.512 (+-0.018) pass@4 0.703``."""
    if not self.show or not evals:
      return
    keys = [k for k in evals[0] if k.startswith('eval/avg@') and not k.endswith('_se')]
    keys += [k for k in evals[0] if k.startswith('eval/pass@')][-1:]  # the largest k
    parts = []
    for key in (k for k in keys if '/' not in k[len('eval/'):]):
      part = f'{key[len("eval/"):]} {self.summary(evals, key)}'
      if f'{key}_se' in evals[0] and len(evals) == 1:
        part += f' (+-{evals[0][f"{key}_se"]:.3f})'
      parts.append(part)
    line = f'eval step {step}: ' + ' '.join(parts)
    if self.bar is not None:
      self.bar.write(line, file=sys.stderr)
    else:
      print(line, file=sys.stderr, flush=True)

  def close(self):
    if self.bar is not None:
      self.bar.close()
