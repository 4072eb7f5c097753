"""Per-step metrics to `<workdir>/metrics.jsonl` and TensorBoard event files, sample generations
to `<workdir>/samples.jsonl` (`jtc.analysis.samples`).

On resume from step s, lines of the JSONL files with `step >= s` are dropped first (they are
recomputed identically) and TensorBoard purges its events from step s on, so a killed and resumed
run leaves exactly one record per step in both, as an uninterrupted run would. A `tracking.Tracker`
(Weights & Biases, when the config asks for it) is handed every record written, the kept ones
first.
"""

import contextlib
import json
import math
import os

import numpy as np

from jtc import files
from jtc.analysis import samples as samples_lib


def _to_python(value):
  value = np.asarray(value)
  if value.size != 1:
    return value.tolist()
  value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_jsonl(path):
  """All records of a metrics file ([] without one; a torn last line from a killed run is left
  out, any other damage is a `files.DamagedFile`)."""
  return files.read_jsonl(path)


def run_dirs(workdir):
  """The directories holding a workdir's runs: its population members' (``members/*/``, in
  member order), or the workdir itself."""
  members = os.path.join(workdir, 'members')
  if not os.path.isdir(members):
    return [workdir]
  found = []
  for name in os.listdir(members):
    path = os.path.join(members, name, 'member.json')
    if os.path.isfile(path):
      member = files.read_json(path, keys=('index',), expected='a population member\'s marker')
      found.append((member['index'], os.path.join(members, name)))
  return [path for _, path in sorted(found)] or [workdir]


def last_record(workdir):
  """The last record of ``workdir``/metrics.jsonl ({} when there is none)."""
  records = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  return records[-1] if records else {}


class MetricWriter:
  """Writes scalar metrics to JSONL (and TensorBoard, when tensorboardX is installed)."""

  def __init__(self, workdir, *, resume_step=0, files=True, tracker=None, log=None, group_size=1):
    self.files = files  # False: records are made but nothing is written (not process 0)
    self.tracker = tracker  # a tracking.Tracker that logs every record too, or None
    # The config's `log` section (its samples_every, samples) and G: the sample generations of
    # the rollouts given to `write` (None: none are written).
    self.log, self.group_size = log, group_size
    if not files:
      return
    os.makedirs(workdir, exist_ok=True)
    self.run_dir, self.path = workdir, os.path.join(workdir, 'metrics.jsonl')
    samples_lib.keep_before(workdir, resume_step)
    kept = [r for r in read_jsonl(self.path) if r.get('step', -1) < resume_step]
    tmp = self.path + '.tmp'
    with open(tmp, 'w') as f:
      for r in kept:
        f.write(json.dumps(r) + '\n')
    os.replace(tmp, self.path)
    for r in kept if tracker else ():  # those it holds already are skipped
      tracker.log(r)
    self._file = open(self.path, 'a')
    try:
      import tensorboardX  # pylint: disable=import-outside-toplevel
      # purge_step hides events of steps >= resume_step written before a kill: every step
      # appears once in TensorBoard too.
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, 'tensorboard'),
                                            purge_step=resume_step)
    except ImportError:
      self._tb = None

  def write(self, step, metrics, rollout=None):
    """Writes the step's record and, at a step `samples.due` under ``log.samples_every``, the
    sample generations of its ``rollout`` (`samples.records`: to samples.jsonl and as the
    tracker's table `samples.TABLE`, at the same step)."""
    samples = None
    if rollout is not None and self.log is not None and samples_lib.due(
        step, self.log.samples_every):
      samples = samples_lib.records(rollout, step, n=self.log.samples, group_size=self.group_size)
    record = {'step': int(step)}
    record.update({k: _to_python(v) for k, v in metrics.items()})
    if not self.files:
      return record
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k != 'step' and isinstance(v, (int, float)):
          self._tb.add_scalar(k, v, int(step))
    if samples:
      samples_lib.append(self.run_dir, samples)
    if self.tracker is not None:
      self.tracker.log(record,
                       tables={samples_lib.TABLE: samples_lib.table(samples)} if samples else None)
    return record

  def close(self, failed=False):
    if not self.files:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self.tracker is not None:
      self.tracker.finish(exit_code=1 if failed else 0)


@contextlib.contextmanager
def closing(writers):
  """Closes every writer on leaving, a failed run's too (its W&B run marked failed)."""
  try:
    yield writers
  except BaseException:
    for w in writers:
      w.close(failed=True)
    raise
  for w in writers:
    w.close()
