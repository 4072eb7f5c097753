"""Prompt data as the trainer reads it: grain pipelines and plain lists over the datasets that
`jtc.data.datasets` prepares (TFDS ``array_record`` files, no TensorFlow), and prompt encoding.

The pipeline (``make_dataset`` / ``make_prompt_iterator``)::

    grain.MapDataset.source(tfds.data_source(...))  # random access over array_record
      -> the rows kept (`selection.Rows.keep`: a held-out fraction, overlong prompts dropped)
      -> equal-size shard per process (index::count)
      -> seeded shuffle, re-shuffled every epoch
      -> repeat(num_epochs) -> batch -> to_iter_dataset()

The returned grain ``DatasetIterator`` has ``get_state()`` / ``set_state(state)``; putting the
state in a checkpoint resumes with exactly the same batches.

Dimension key (docs/dimensions.md): B prompts, P prompt width.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Iterable, NamedTuple

import grain
import numpy as np

from jtc.data import datasets
from jtc.data import examples
from jtc.data import formats
from jtc.data import overlong as overlong_lib
from jtc.data import selection


class Subset(Sequence):
  """The records of a split at ``keep`` (indices in stored order; `selection.Rows.keep`)."""

  def __init__(self, records, keep: Sequence[int]):
    self._records, self._keep = records, keep

  def __len__(self):
    return len(self._keep)

  def __getitem__(self, i):
    return self._records[self._keep[i]]


def _records(source: str, *, split: str, data_dir: str | None, keep: Sequence[int] | None,
             **prepare_kwargs: Any):
  records = datasets.data_source(source, split=split, data_dir=data_dir, **prepare_kwargs)
  return records if keep is None else Subset(records, keep)


def load_examples(
    source: str,
    *,
    split: str,
    data_dir: str | None = None,
    limit: int | None = None,
    keep: Sequence[int] | None = None,
    **prepare_kwargs: Any,
) -> list[dict[str, Any]]:
  """The first ``limit`` (default all) examples of a split (of its rows at ``keep``, when given),
    in stored order, as dicts of str.

    For evaluation loops and SFT that want plain lists rather than an iterator; reads the same
    prepared array_record files as ``make_prompt_iterator``.
    """
  records = _records(source, split=split, data_dir=data_dir, keep=keep, **prepare_kwargs)
  n = len(records) if limit is None else min(int(limit), len(records))
  return [_example(records[i]) for i in range(n)]


def load_rows(rows: selection.Rows, *, data_dir: str | None,
              limit: int | None = None) -> list[dict[str, Any]]:
  """`load_examples` of a `selection.Rows`."""
  return load_examples(rows.source, split=rows.split, data_dir=data_dir, limit=limit,
                       keep=rows.keep, **dict(rows.fields))


def _example(record: dict[str, Any]) -> dict[str, Any]:
  """A stored record as the trainer reads it (str fields; a chat prompt as `examples.Conversation`)."""
  return examples.as_example(datasets.decode(record))


def _collate(examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """List of examples -> dict of lists (nested dicts kept nested)."""
  first = examples[0]
  return {
      k:
          _collate([e[k]
                    for e in examples]) if isinstance(first[k], dict) else [e[k]
                                                                            for e in examples]
      for k in first
  }


def make_dataset(
    source: str,
    *,
    split: str,
    seed: int,
    data_dir: str | None = None,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    keep: Sequence[int] | None = None,
    **prepare_kwargs: Any,
) -> grain.MapDataset:
  """Per-example ``grain.MapDataset`` of ``{'prompt', 'answer', ...}`` dicts of str.

    Shards (default ``jax.process_index()`` of ``jax.process_count()``) are contiguous-strided
    slices of equal size (the last ``len % count`` records are dropped so every process sees
    the same number of batches); then a ``seed``-ed shuffle, re-drawn every epoch, and
    ``num_epochs`` repeats (``None`` = forever). ``keep``: only the split's rows at these indices
    (`selection.Rows.keep`).
    """
  if shard_index is None or shard_count is None:
    import jax

    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f'shard_index must be in [0, {shard_count}), got {shard_index}')
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f'num_epochs must be >= 1 or None, got {num_epochs}')
  records = _records(source, split=split, data_dir=data_dir, keep=keep, **prepare_kwargs)
  n = len(records) // shard_count * shard_count
  if n == 0:
    raise ValueError(
        f'empty dataset: split {split!r} of {source!r} has {len(records)} records, fewer than '
        f'{shard_count} shards')
  ds = grain.MapDataset.source(records)[:n][shard_index::shard_count].map(_example)
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


def make_prompt_iterator(
    source: str,
    *,
    split: str,
    batch_size: int,
    seed: int,
    data_dir: str | None = None,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    shard_index: int | None = None,
    shard_count: int | None = None,
    tokenizer: Any = None,
    prompt_width: int | None = None,
    **prepare_kwargs: Any,
) -> grain.DatasetIterator:
  """The iterator the trainer calls: batches of prompts and reference answers.

    Each batch is ``{'prompt': [str]*B, 'answer': [str]*B, ...}`` (synthetic tasks add
    ``'solutions': {format: [str]*B}``, a dataset adds ``'solution'``; a prompt of several chat
    messages is a `examples.Conversation`). With ``tokenizer`` and
    ``prompt_width`` it also holds ``'prompt_tokens'``/``'prompt_mask'`` int32 ``[B, P]``
    (``encode_prompts``). ``batch_size`` is per process. ``iterator.get_state()`` /
    ``set_state()`` save and restore the position. Other kwargs go to ``prepare``.
    """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  if (tokenizer is None) != (prompt_width is None):
    raise ValueError('tokenizer and prompt_width must be given together')
  ds = make_dataset(
      source,
      split=split,
      seed=seed,
      data_dir=data_dir,
      shuffle=shuffle,
      num_epochs=num_epochs,
      shard_index=shard_index,
      shard_count=shard_count,
      **prepare_kwargs,
  )
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_collate)
  if tokenizer is not None:

    def add_tokens(batch):
      tokens_BP, mask_BP = encode_prompts(tokenizer, batch['prompt'], width=prompt_width)
      return {**batch, 'prompt_tokens': tokens_BP, 'prompt_mask': mask_BP}

    ds = ds.map(add_tokens)
  return iter(ds.to_iter_dataset())


def rendered(tokenizer: Any, prompt: str, *, chat_template: bool = True) -> str:
  """A prompt's text as the policy reads it: the chat template applied (a `examples.Conversation`
  goes to it as its messages), or, ``chat_template=False``, its plain text."""
  if not chat_template:
    return str(prompt)
  return tokenizer.apply_chat_template(
      prompt.messages if isinstance(prompt, examples.Conversation) else prompt)


def prompt_ids(tokenizer: Any, prompt: str, *, add_bos: bool = True,
               chat_template: bool = True) -> list[int]:
  """``[bos] + encode(rendered(prompt))``: a prompt's tokens as the policy reads them (bos only if
  the tokenizer has one, ``add_bos`` is set and the template did not add it)."""
  ids = tokenizer.encode(rendered(tokenizer, prompt, chat_template=chat_template))
  if add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
    ids = [tokenizer.bos_id] + ids
  return ids


def fitted_ids(tokenizer: Any, prompt: str, *, width: int, add_bos: bool = True,
               chat_template: bool = True) -> list[int]:
  """`prompt_ids`, cut on the left to ``width`` tokens when longer (``data.overlong='truncate'``,
  `overlong.cut_left`): the tokens right after BOS go, never those of the last user turn
  (ValueError naming the prompt when the cut would reach them)."""
  ids = prompt_ids(tokenizer, prompt, add_bos=add_bos, chat_template=chat_template)
  if len(ids) <= width:
    return ids
  text = rendered(tokenizer, prompt, chat_template=chat_template)
  text_ids = tokenizer.encode(text)
  before = tokenizer.encode(text[:overlong_lib.last_turn_start(text, prompt)])
  head = int(tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id)
  added = len(ids) - len(text_ids)  # 1 when BOS was put before the text
  cuttable = max(0, added + overlong_lib.common_prefix(text_ids, before) - head)
  try:
    return overlong_lib.cut_left(ids, width=width, head=head, cuttable=cuttable)
  except ValueError as e:
    raise ValueError(f'prompt {str(prompt)!r:.100}: {e}') from None


def encode_prompts(
    tokenizer: Any,
    prompts: Iterable[str],
    *,
    width: int,
    add_bos: bool = True,
    chat_template: bool = True,
    truncate: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Tokenizes prompts and LEFT-pads them to ``width`` (the prompt bucket P).

    Each prompt becomes its `prompt_ids` (``truncate``: its `fitted_ids`), right-aligned so every
    completion starts at column P.

    Returns:
      tokens_BP: int32 ``[B, P]``, ``pad_id`` on the left.
      mask_BP: int32 ``[B, P]``, 1 on real tokens, 0 on padding.

    Raises:
      ValueError naming the first prompt whose tokens do not fit in ``width``.
    """
  prompts = list(prompts)
  if width < 1:
    raise ValueError(f'width must be >= 1, got {width}')
  tokens_BP = np.full((len(prompts), width), tokenizer.pad_id, dtype=np.int32)
  mask_BP = np.zeros((len(prompts), width), dtype=np.int32)
  for b, prompt in enumerate(prompts):
    kwargs = dict(add_bos=add_bos, chat_template=chat_template)
    ids = (fitted_ids(tokenizer, prompt, width=width, **kwargs) if truncate else prompt_ids(
        tokenizer, prompt, **kwargs))
    if len(ids) > width:
      raise ValueError(
          f'prompt {prompt!r} has {len(ids)} tokens, more than the prompt width {width}')
    if ids:
      tokens_BP[b, width - len(ids):] = ids
      mask_BP[b, width - len(ids):] = 1
  return tokens_BP, mask_BP


def fit_rows(rows: selection.Rows, data: Any, *, tokenizer: Any, data_dir: str | None,
             what: str) -> tuple[selection.Rows, str]:
  """``rows`` under ``data.overlong`` drop / truncate (`jtc.data.overlong`), every prompt measured
  (suffix and chat template included): (the rows kept, the line that says how many prompts were
  dropped or truncated). A prompt truncation cannot fit is a ValueError naming its row."""
  width, mode = data.prompt_width, data.overlong
  prompts = [e['prompt'] + data.prompt_suffix for e in load_rows(rows, data_dir=data_dir)]
  kwargs = dict(chat_template=data.chat_template)
  over = [i for i, p in enumerate(prompts) if len(prompt_ids(tokenizer, p, **kwargs)) > width]
  if mode == 'drop':
    kept = sorted(set(range(len(prompts))) - set(over))
    if not kept:
      raise ValueError(f'config.data.overlong=\'drop\' drops every {what} prompt of '
                       f'{rows.source!r} (split {rows.split!r}): none fits in '
                       f'config.data.prompt_width={width}')
    rows = rows.subset(kept)
  else:
    for i in over:
      try:
        fitted_ids(tokenizer, prompts[i], width=width, **kwargs)
      except ValueError as e:
        raise ValueError(f'{rows.where(i)}: {e}') from None
  return rows, overlong_lib.note(mode, over=len(over), total=len(prompts), what=what, width=width)


class RunData(NamedTuple):
  """What a run of a config's `data` section reads (`run_data`)."""
  train_iters: list  # a training prompt iterator per seed (one per population member)
  eval_examples: list  # the held-out problems ([]: evaluation is skipped)
  width_prompts: list  # prompts to check the prompt width on: held-out and <= 2,000 training
  notes: list  # lines to print before the run (data.overlong's counts)


def held_out_examples(data: Any, *, limit: int, tokenizer: Any = None,
                      whole_dataset: bool = False) -> tuple[str, list[dict[str, Any]], list[str]]:
  """(the held-out split, its first ``limit`` problems, notes) of a config's `data` section
  (`selection.held_out_rows`; ``whole_dataset``: `jtc eval`'s rows), overlong prompts dropped or
  checked first under ``data.overlong`` drop / truncate (with ``tokenizer``)."""
  data_dir = data.data_dir or None
  held = selection.held_out_rows(data, whole_dataset=whole_dataset)
  if held is None:
    return '', [], []
  notes = []
  if data.overlong != 'error' and tokenizer is not None:
    held, note = fit_rows(held, data, tokenizer=tokenizer, data_dir=data_dir, what='held-out')
    notes.append(note)
  return held.split, load_rows(held, data_dir=data_dir, limit=limit), notes


def run_data(data: Any, *, batch_size: int, seeds: Sequence[int], eval_problems: int,
             tokenizer: Any = None) -> RunData:
  """What a run of a config's `data` section reads (`RunData`): its rows (`selection`),
  overlong prompts dropped or checked under ``data.overlong`` drop / truncate (``tokenizer``
  measures them).

  Every process reads the same global batch (shard 0 of 1): host-side logic (rewards,
  advantages) is replicated, the device work is sharded over the mesh.
  """
  data_dir = data.data_dir or None  # None: jtc's cache ($JTC_DATA_DIR or ~/.cache/jtc/data)
  train = selection.train_rows(data)
  notes = []
  if data.overlong != 'error':
    if tokenizer is None:
      raise ValueError(f'config.data.overlong={data.overlong!r} measures every prompt: pass the '
                       'tokenizer')
    train, note = fit_rows(train, data, tokenizer=tokenizer, data_dir=data_dir, what='training')
    notes.append(note)
  train_iters = [
      make_prompt_iterator(train.source, split=train.split, batch_size=batch_size, seed=seed,
                           data_dir=data_dir, shard_index=0, shard_count=1, keep=train.keep,
                           **dict(train.fields)) for seed in seeds
  ]
  _, eval_examples, held_notes = held_out_examples(data, limit=eval_problems, tokenizer=tokenizer)
  train_examples = load_rows(train, data_dir=data_dir, limit=2000)
  return RunData(train_iters, eval_examples, [e['prompt'] for e in eval_examples + train_examples],
                 notes + held_notes)


def check_config(data: Any, *, tasks: Any, reward_fns: Any) -> None:
  """A config's `data` section, before any compute (``tasks``, ``reward_fns``: the valid
    task and verifier names): a dataset's format and splits are detected here (its rows are
    checked when it is prepared, also before any compute)."""
  for key in ('dataset', 'eval_dataset'):
    if data[key]:
      try:
        formats.detect(data[key])
      except ValueError as e:
        raise ValueError(
            f'config.data.{key}={data[key]!r} is not a dataset jtc reads: {e}') from None
  if not data.dataset and data.task not in tasks:
    raise ValueError(f'config.data.task={data.task!r} is not valid; valid: {sorted(tasks)} '
                     '(or set config.data.dataset)')
  if not data.dataset and (data.eval_dataset or data.question_field or data.answer_field):
    key = next(k for k in ('eval_dataset', 'question_field', 'answer_field') if data[k])
    raise ValueError(f'config.data.{key}={data[key]!r} needs config.data.dataset (a task has '
                     'no dataset file)')
  if data.reward and ':' not in data.reward and data.reward not in reward_fns:
    raise ValueError(f'config.data.reward={data.reward!r} is not valid; valid: '
                     f'{sorted(reward_fns)}')
  overlong_lib.check(data.overlong)
  selection.check_config(data)
