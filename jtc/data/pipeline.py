"""Prompt data as the trainer reads it: grain pipelines and plain lists over the datasets that
`jtc.data.datasets` prepares (TFDS ``array_record`` files, no TensorFlow), and prompt encoding.

The pipeline (``make_dataset`` / ``make_prompt_iterator``)::

    grain.MapDataset.source(tfds.data_source(...))  # random access over array_record
      -> equal-size shard per process (index::count)
      -> seeded shuffle, re-shuffled every epoch
      -> repeat(num_epochs) -> batch -> to_iter_dataset()

The returned grain ``DatasetIterator`` has ``get_state()`` / ``set_state(state)``; putting the
state in a checkpoint resumes with exactly the same batches.

Dimension key (docs/dimensions.md): B prompts, P prompt width.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import grain
import numpy as np

from jtc.data import datasets
from jtc.data import examples
from jtc.data import formats


def load_examples(
    source: str,
    *,
    split: str,
    data_dir: str | None = None,
    limit: int | None = None,
    **prepare_kwargs: Any,
) -> list[dict[str, Any]]:
  """The first ``limit`` (default all) examples of a split, in stored order, as dicts of str.

    For evaluation loops and SFT that want plain lists rather than an iterator; reads the same
    prepared array_record files as ``make_prompt_iterator``.
    """
  records = datasets.data_source(source, split=split, data_dir=data_dir, **prepare_kwargs)
  n = len(records) if limit is None else min(int(limit), len(records))
  return [_example(records[i]) for i in range(n)]


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
    **prepare_kwargs: Any,
) -> grain.MapDataset:
  """Per-example ``grain.MapDataset`` of ``{'prompt', 'answer', ...}`` dicts of str.

    Shards (default ``jax.process_index()`` of ``jax.process_count()``) are contiguous-strided
    slices of equal size (the last ``len % count`` records are dropped so every process sees
    the same number of batches); then a ``seed``-ed shuffle, re-drawn every epoch, and
    ``num_epochs`` repeats (``None`` = forever).
    """
  if shard_index is None or shard_count is None:
    import jax

    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f'shard_index must be in [0, {shard_count}), got {shard_index}')
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f'num_epochs must be >= 1 or None, got {num_epochs}')
  records = datasets.data_source(source, split=split, data_dir=data_dir, **prepare_kwargs)
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


def prompt_ids(tokenizer: Any, prompt: str, *, add_bos: bool = True,
               chat_template: bool = True) -> list[int]:
  """``[bos] + encode(apply_chat_template(prompt))``: a prompt's tokens as the policy reads them
  (bos only if the tokenizer has one, ``add_bos`` is set and the template did not add it).

  A `examples.Conversation` goes to the template as its messages; without the template
  (``chat_template=False``) it is its plain text."""
  if chat_template:
    text = tokenizer.apply_chat_template(
        prompt.messages if isinstance(prompt, examples.Conversation) else prompt)
  else:
    text = str(prompt)
  ids = tokenizer.encode(text)
  if add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
    ids = [tokenizer.bos_id] + ids
  return ids


def encode_prompts(
    tokenizer: Any,
    prompts: Iterable[str],
    *,
    width: int,
    add_bos: bool = True,
    chat_template: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
  """Tokenizes prompts and LEFT-pads them to ``width`` (the prompt bucket P).

    Each prompt becomes its `prompt_ids`, right-aligned so every completion starts at column P.

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
    ids = prompt_ids(tokenizer, prompt, add_bos=add_bos, chat_template=chat_template)
    if len(ids) > width:
      raise ValueError(
          f'prompt {prompt!r} has {len(ids)} tokens, more than the prompt width {width}')
    if ids:
      tokens_BP[b, width - len(ids):] = ids
      mask_BP[b, width - len(ids):] = 1
  return tokens_BP, mask_BP


def _fields(data: Any) -> dict[str, str]:
  """The field names of a config's `data` section, as `datasets.prepare` takes them."""
  return {'question_field': data.question_field, 'answer_field': data.answer_field}


def train_split(path: str) -> str:
  """The split of a dataset that trains: ``'train'``, else its only split (a directory holding
  one ``dapo-math-17k.parquet``); ValueError naming its splits otherwise."""
  splits = sorted(formats.detect(path).splits)
  if 'train' in splits:
    return 'train'
  if len(splits) == 1:
    return splits[0]
  raise ValueError(f'{path}: no train split to train on; its splits are {splits}')


def held_out_split(path: str) -> str:
  """The split of a dataset that holds out problems: ``'test'``, else its only split."""
  splits = sorted(formats.detect(path).splits)
  if 'test' in splits:
    return 'test'
  if len(splits) == 1:
    return splits[0]
  raise ValueError(f'{path}: no test split to evaluate on; its splits are {splits}')


def held_out_examples(data: Any, *, data_dir: str | None, limit: int) -> list[dict[str, Any]]:
  """The held-out problems of a config's `data` section: the task's test split, the
    `eval_dataset`'s test split (or its only split: a file), or the dataset's test split; []
    when there is none (evaluation is then skipped)."""
  if not data.dataset:
    return load_examples(data.task, split='test', data_dir=data_dir, limit=limit)
  if data.eval_dataset:
    return load_examples(data.eval_dataset, split=held_out_split(data.eval_dataset),
                         data_dir=data_dir, limit=limit, **_fields(data))
  if 'test' in formats.detect(data.dataset).splits:
    return load_examples(data.dataset, split='test', data_dir=data_dir, limit=limit,
                         **_fields(data))
  return []


def run_data(
    data: Any, *, batch_size: int, seeds: Sequence[int],
    eval_problems: int) -> tuple[list[grain.DatasetIterator], list[dict[str, Any]], list[str]]:
  """What a run of a config's `data` section reads: (a training prompt iterator per seed (one per
  member of a population), held-out examples, prompts to size the prompt width on: the held-out
  ones and up to 2,000 training ones).

  Every process reads the same global batch (shard 0 of 1): host-side logic (rewards,
  advantages) is replicated, the device work is sharded over the mesh.
  """
  data_dir = data.data_dir or None  # None: jtc's cache ($JTC_DATA_DIR or ~/.cache/jtc/data)
  source = data.dataset or data.task
  fields = _fields(data) if data.dataset else {}
  split = train_split(data.dataset) if data.dataset else 'train'
  train_iters = [
      make_prompt_iterator(source, split=split, batch_size=batch_size, seed=seed, data_dir=data_dir,
                           shard_index=0, shard_count=1, **fields) for seed in seeds
  ]
  eval_examples = held_out_examples(data, data_dir=data_dir, limit=eval_problems)
  train_examples = load_examples(source, split=split, data_dir=data_dir, limit=2000, **fields)
  return train_iters, eval_examples, [e['prompt'] for e in eval_examples + train_examples]


def check_config(data: Any, *, tasks: Any, reward_fns: Any) -> None:
  """A config's `data` section, before any compute (``tasks``, ``reward_fns``: the valid
    task and verifier names): a dataset's format is detected here (its rows are checked when it
    is prepared, also before any compute)."""
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
