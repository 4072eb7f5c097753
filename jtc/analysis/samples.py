"""Sample generations of a run, to read while it runs (``log.samples_every``, ``log.samples``).

Every ``log.samples_every`` RL steps, the first completion of each of the step's first
``log.samples`` prompts, with its reward, reference answer and ``data_source``, is appended to
``<run dir>/samples.jsonl`` (a population member's own directory) and, with W&B on, logged as the
table ``samples`` at that step (`tracking.Tracker.log`); `metric_writer.MetricWriter` writes
them with the step's metrics. They are the training rollouts the step
already sampled and scored: logging them draws nothing and computes nothing, so a run's results
are the same with it on or off.

On resume from step s, lines of step >= s are dropped first (they are recomputed identically), as
metrics.jsonl's (`metric_writer`): a killed and resumed run holds each step's samples once.

Dimension key (docs/dimensions.md): B rollout rows (prompts x G samples).
"""
from __future__ import annotations

import json
import os

from jtc import files

FILE = 'samples.jsonl'
TABLE = 'samples'  # the W&B table's key
COLUMNS = ('step', 'prompt', 'completion', 'reward', 'answer', 'data_source')


def due(step: int, every: int) -> bool:
  """Whether step ``step`` logs samples (``every`` = ``log.samples_every``; 0 = never)."""
  return bool(every) and step % every == 0


def records(rollout, step: int, *, n: int, group_size: int) -> list[dict]:
  """The sample records of a `rollout.Rollout` (rows ``b * G + g``): the first completion of each
  of its first ``n`` prompts (`COLUMNS`)."""
  rows = range(0, len(rollout.texts), group_size)[:n]
  prompts, answers = rollout.prompts, rollout.answers
  return [{
      'step': int(step),
      'prompt': str(prompts[r]) if prompts else '',
      'completion': rollout.texts[r],
      'reward': float(rollout.rewards_B[r]),
      'answer': str(answers[r]) if answers else '',
      'data_source': getattr(answers[r], 'data_source', '') if answers else '',
  } for r in rows]


def table(rows: list[dict]) -> dict:
  """``{'columns', 'data'}`` of sample records: what `tracking.Tracker.log` makes a W&B table of."""
  return {'columns': list(COLUMNS), 'data': [[r[k] for k in COLUMNS] for r in rows]}


def read(run_dir: str) -> list[dict]:
  """The sample records of ``run_dir`` ([] without any; a torn last line is left out)."""
  return files.read_jsonl(os.path.join(run_dir, FILE))


def keep_before(run_dir: str, resume_step: int) -> None:
  """Drops the lines of steps >= ``resume_step`` from ``run_dir``/`FILE` (a resumed run writes
  them again)."""
  path = os.path.join(run_dir, FILE)
  if not os.path.exists(path):
    return
  kept = [r for r in read(run_dir) if r.get('step', -1) < resume_step]
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + '\n' for r in kept)
  os.replace(tmp, path)


def append(run_dir: str, rows: list[dict]) -> None:
  """Appends sample records to ``run_dir``/`FILE`."""
  with open(os.path.join(run_dir, FILE), 'a') as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + '\n' for r in rows)
