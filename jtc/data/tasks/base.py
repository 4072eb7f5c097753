"""What every synthetic task shares: the Task interface and the hash-based train/test split.

A problem's split is a function of its canonical key alone (``split_of``), never of the seed:
the same problem is in the same split for every seed, so train and test cannot overlap.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

SPLITS = ('train', 'test')
Example = dict[str, Any]  # {'prompt': str, 'answer': str, 'solutions': {format_name: str}}


@runtime_checkable
class Task(Protocol):
  """A synthetic task with a verifier and named, equally rewarded solution formats."""

  name: str
  formats: tuple[str, ...]
  scaffold: str  # a prefix every solution starts with ('' if none): the shared tokens

  def examples(self, split: str, *, seed: int, num_examples: int) -> list[Example]:
    ...

  def reward_fn(self, prompts: Sequence[str], completions: Sequence[str],
                answers: Sequence[str]) -> np.ndarray:
    ...

  def format_of(self, completion: str) -> str | None:
    ...

  def config(self) -> dict[str, Any]:
    ...


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; valid: {list(SPLITS)}')


def split_of(key: str, *, test_fraction: float) -> str:
  """'test' for a stable ``test_fraction`` of problem keys (sha256, not Python's hash)."""
  digest = hashlib.sha256(key.encode('utf-8')).digest()
  u = int.from_bytes(digest[:8], 'big') / 2.0**64
  return 'test' if u < test_fraction else 'train'


def _name_seed(name: str) -> int:
  return int.from_bytes(hashlib.sha256(name.encode('utf-8')).digest()[:4], 'big')


def sample_unique(
    sample: Callable[[np.random.Generator], tuple[str, Example]],
    *,
    task_name: str,
    split: str,
    seed: int,
    num_examples: int,
    test_fraction: float,
    max_tries_per_example: int = 200,
) -> list[Example]:
  """Draws ``num_examples`` distinct problems (by key) that belong to ``split``.

    ``sample(rng) -> (key, example)``. Deterministic in (task_name, split, seed). Raises
    ``ValueError`` when the split does not hold that many distinct problems (the draw budget of
    ``max_tries_per_example * num_examples + 1000`` runs out).
    """
  check_split(split)
  if num_examples < 1:
    raise ValueError(f'num_examples must be >= 1, got {num_examples}')
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'test_fraction must be in (0, 1), got {test_fraction}')
  rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, SPLITS.index(split), _name_seed(task_name)])
  seen: set[str] = set()
  out: list[Example] = []
  budget = max_tries_per_example * num_examples + 1000
  for _ in range(budget):
    key, example = sample(rng)
    if key in seen or split_of(key, test_fraction=test_fraction) != split:
      continue
    seen.add(key)
    out.append(example)
    if len(out) == num_examples:
      return out
  raise ValueError(
      f'task {task_name!r} split {split!r}: found only {len(out)} distinct problems of the '
      f'{num_examples} asked for; lower num_examples or make the task harder (more digits/numbers)')


class SampledTask:
  """``examples`` for a task that draws one problem at a time: ``self._sample(rng) -> (key,
  example)``, with ``name`` and ``test_fraction`` attributes (see ``sample_unique``)."""

  def examples(self, split: str, *, seed: int, num_examples: int) -> list[Example]:
    """``num_examples`` distinct problems (by key) of ``split``, deterministic in ``seed``."""
    return sample_unique(self._sample, task_name=self.name, split=split, seed=seed,
                         num_examples=num_examples, test_fraction=self.test_fraction)
