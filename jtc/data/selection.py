"""Which rows of a config's `data` section train (`train_rows`) and which are held out
(`held_out_rows`), and the checks of its split keys before any compute (`check_config`).

- Training: split ``data.train_split`` of ``data.dataset`` ('' = its ``train`` split, else its
  only split). A task (no dataset) trains on its ``train`` split and holds out its ``test`` split.
- Held out, the first that applies:

  1. ``data.eval_dataset``: its ``data.eval_split`` ('' = its ``test`` split, else its only split);
  2. the dataset's ``data.eval_split`` ('' = its ``test`` split, when it has one);
  3. ``data.eval_fraction`` > 0: that fraction of the training split's rows, drawn by a permutation
     seeded with ``data.split_seed`` (the same rows whatever the run's seed or population member),
     and no longer trained on;
  4. none: evaluation is skipped. (`jtc eval`, ``whole_dataset=True``, evaluates a dataset of one
     split on that split: the dataset it is given is the test set.)

A `Rows` is one split of a prepared dataset and the rows of it that are kept (``keep``: indices
in stored order; None: all of them): a held-out fraction and ``data.overlong='drop'``
(`jtc.data.overlong`) leave rows out.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jtc.data import datasets
from jtc.data import formats


@dataclasses.dataclass(frozen=True)
class Rows:
  """One split of a task or dataset (``source``), the field names it is read with, the rows kept."""
  source: str
  split: str
  fields: tuple[tuple[str, str], ...] = ()  # (('question_field', f), ('answer_field', f))
  keep: tuple[int, ...] | None = None

  def where(self, i: int) -> str:
    """Row ``i`` of the rows kept, named in the split as stored (for messages)."""
    row = i if self.keep is None else self.keep[i]
    return f'split {self.split!r} row {row} of {self.source!r}'

  def subset(self, kept) -> 'Rows':
    """These rows without those not in ``kept`` (indices into the rows kept)."""
    base = range(1 << 62) if self.keep is None else self.keep
    return dataclasses.replace(self, keep=tuple(int(base[i]) for i in kept))


def _split(path: str, named: str, key: str, default: str, role: str) -> str:
  """``named`` (config.data.<key>), else ``default``, else the dataset's only split; a ValueError
  naming its splits."""
  splits = sorted(formats.detect(path).splits)
  if named:
    if named not in splits:
      raise ValueError(f'config.data.{key}={named!r} is not a split of {path!r}; valid: {splits}')
    return named
  if default in splits:
    return default
  if len(splits) == 1:
    return splits[0]
  raise ValueError(f'{path}: no {default} split to {role}; its splits are {splits} (name one with '
                   f'config.data.{key})')


def train_split(path: str, named: str = '') -> str:
  """The split of a dataset that trains: ``named`` (``data.train_split``), else ``'train'``, else its
  only split (a directory holding one ``dapo-math-17k.parquet``)."""
  return _split(path, named, 'train_split', 'train', 'train on')


def held_out_split(path: str, named: str = '') -> str:
  """The split of a dataset that holds out problems: ``named`` (``data.eval_split``), else
  ``'test'``, else its only split."""
  return _split(path, named, 'eval_split', 'test', 'evaluate on')


def fraction_split(n: int, fraction: float, seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(held-out rows, training rows) of ``n``: ``round(fraction * n)`` (at least 1) drawn by the
  permutation of ``seed``, each in increasing order; ValueError when none would be left to train."""
  k = max(1, round(fraction * n))
  if k >= n:
    raise ValueError(f'config.data.eval_fraction={fraction} holds out {k} of the {n} training rows '
                     'and leaves none to train on')
  order = np.random.default_rng(seed).permutation(n)
  return tuple(sorted(map(int, order[:k]))), tuple(sorted(map(int, order[k:])))


def fields(data: Any) -> tuple[tuple[str, str], ...]:
  """A dataset's field names as `datasets.prepare` takes them (`Rows.fields`)."""
  return (('question_field', data.question_field), ('answer_field', data.answer_field))


def _held_out_named(data: Any) -> str:
  """The split of the dataset itself that holds out problems ('' when none does)."""
  return data.eval_split or ('test' if 'test' in formats.detect(data.dataset).splits else '')


def _fraction(data: Any) -> tuple[Rows, Rows]:
  """(training rows, held-out rows) of ``data.eval_fraction`` of the training split."""
  train = Rows(data.dataset, train_split(data.dataset, data.train_split), fields(data))
  n = len(
      datasets.data_source(data.dataset, split=train.split, data_dir=data.data_dir or None,
                           **dict(train.fields)))
  held, trained = fraction_split(n, data.eval_fraction, data.split_seed)
  return dataclasses.replace(train, keep=trained), dataclasses.replace(train, keep=held)


def train_rows(data: Any) -> Rows:
  """The rows of a config's `data` section that train (module docstring)."""
  if not data.dataset:
    return Rows(data.task, 'train')
  if data.eval_fraction:
    return _fraction(data)[0]
  return Rows(data.dataset, train_split(data.dataset, data.train_split), fields(data))


def held_out_rows(data: Any, *, whole_dataset: bool = False) -> Rows | None:
  """The held-out rows of a config's `data` section, None when it has none (module docstring;
  ``whole_dataset``: `jtc eval`'s, a dataset of one split is held out whole)."""
  if not data.dataset:
    return Rows(data.task, 'test')
  if data.eval_dataset:
    return Rows(data.eval_dataset, held_out_split(data.eval_dataset, data.eval_split), fields(data))
  named = _held_out_named(data)
  if named:
    return Rows(data.dataset, held_out_split(data.dataset, named), fields(data))
  if data.eval_fraction:
    return _fraction(data)[1]
  if whole_dataset:
    return Rows(data.dataset, held_out_split(data.dataset), fields(data))
  return None


def check_config(data: Any) -> None:
  """The split keys of a config's `data` section, before any compute (the dataset's splits are
  detected from its files; its rows are read when it is prepared)."""
  if not 0.0 <= data.eval_fraction < 1.0:
    raise ValueError(f'config.data.eval_fraction={data.eval_fraction} is not valid; valid: '
                     '0 <= eval_fraction < 1 (0 = no held-out fraction)')
  if not data.dataset:
    named = [k for k in ('train_split', 'eval_split', 'eval_fraction') if data[k]]
    if named:
      raise ValueError(f'config.data.{named[0]}={data[named[0]]!r} needs config.data.dataset (a '
                       "task's splits are 'train' and 'test')")
    return
  train_split(data.dataset, data.train_split)
  if data.eval_dataset:
    held_out_split(data.eval_dataset, data.eval_split)
  elif data.eval_split:
    held_out_split(data.dataset, data.eval_split)
  if data.eval_fraction and (data.eval_dataset or _held_out_named(data)):
    held = (f'config.data.eval_dataset={data.eval_dataset!r}'
            if data.eval_dataset else f'the dataset\'s {_held_out_named(data)!r} split')
    raise ValueError(f'config.data.eval_fraction={data.eval_fraction} holds out training rows, but '
                     f'{held} is held out already; set one of them')
