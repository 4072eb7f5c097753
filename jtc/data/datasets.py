"""Prepared datasets: TFDS builders of the prompt data and their concurrency-safe preparation.

Two TFDS builders, neither needing TensorFlow (tfds 4.9.10 writes and reads ``array_record``
files with its numpy codecs):

- ``JtcSynthetic``: a synthetic task of ``jtc.data.tasks`` (``'arithmetic'``, ``'countdown'``), with
  features ``prompt``, ``answer`` and ``solutions/<format>``.
- ``JtcFiles``: a local dataset of `jtc.data.formats` (JSONL, verl-style parquet, a Hugging Face
  ``save_to_disk`` directory), features ``formats.RECORD_FIELDS`` (the records of
  `formats.read_files`).

Prepared data lives in ``data_dir`` (default ``$JTC_DATA_DIR`` or ``~/.cache/jtc/data``) in a
folder keyed by a hash of everything that defines it (task config, generation seed, sizes; for
a dataset its format, file paths, sizes and mtimes and the field names), so it is built once and
rebuilt when that changes. A dataset's rows are all read and checked before TFDS preparation
starts, so a malformed row fails with its file, row and field and leaves nothing behind.

Preparation is safe under concurrency: processes that start together on a fresh ``data_dir``
(several trainers of one machine) serialise on an exclusive ``fcntl.flock`` of
``<data_dir>/.<folder>.lock``; the first builds, the others wait and then read what it built.
Nothing is downloaded, so TFDS's "Downloading and preparing dataset" / "Dataset ... prepared"
lines are not printed (one ``absl`` INFO line says what was generated); reading a prepared
dataset prints nothing. `jtc.data.pipeline` reads what is prepared here.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from jtc import files as files_lib
from jtc.data import file_lists
from jtc.data import formats
from jtc.data import tasks as tasks_lib

DEFAULT_NUM_EXAMPLES = {'train': 5000, 'test': 500}
PREPARED = 'a dataset prepared by jtc (TFDS files; remove the folder to prepare it again)'


def default_data_dir() -> str:
  """``$JTC_DATA_DIR`` if set, else ``~/.cache/jtc/data``."""
  return os.environ.get('JTC_DATA_DIR') or os.path.join(os.path.expanduser('~'), '.cache', 'jtc',
                                                        'data')


# ----------------------------------------------------------------------------- builders


class _LocalBuilder(tfds.core.GeneratorBasedBuilder):
  """A builder with no code-side files (checksums, metadata) to look up.

    Both builders set ``disable_shuffling=True``: records keep generation order (synthetic
    problems are already random; JSONL keeps file order), so ``load_examples(limit=n)`` is the
    first n generated problems / lines.

    tfds 4.9.10 resolves ``code_path`` of a builder defined inside a package through the
    ``importlib_resources`` backport, which it only installs on Python < 3.9; nothing here needs
    that path, so it is None.
    """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return None


class JtcSynthetic(_LocalBuilder):
  """A ``jtc.data.tasks`` task as a TFDS dataset; ``spec`` is the JSON of ``_synthetic_spec``."""

  VERSION = tfds.core.Version('1.0.0')

  def __init__(self, *, spec: str, **kwargs):
    self._spec = json.loads(spec)
    self._task = tasks_lib.get_task(self._spec['task'], **self._spec['task_kwargs'])
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        disable_shuffling=True,
        description=f'jtc synthetic task {self._spec}',
        features=tfds.features.FeaturesDict({
            'prompt':
                tfds.features.Text(),
            'answer':
                tfds.features.Text(),
            'solutions':
                tfds.features.FeaturesDict({f: tfds.features.Text() for f in self._task.formats}),
        }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    # Generate eagerly so "not enough distinct problems" fails here with its own ValueError.
    examples = {
        split: self._task.examples(split, seed=self._spec['seed'], num_examples=n)
        for split, n in self._spec['num_examples'].items()
    }
    return {split: self._generate_examples(exs) for split, exs in examples.items()}

  def _generate_examples(self, examples):
    for i, example in enumerate(examples):
      yield i, example


class JtcFiles(_LocalBuilder):
  """A `jtc.data.formats` dataset as a TFDS dataset; ``spec`` is the JSON of ``_files_spec``.

    ``records`` (``{split: records}``, already read and checked by `formats.read_files`) spares
    preparation a second reading; without it the files are read here.
    """

  VERSION = tfds.core.Version('1.0.0')

  def __init__(self, *, spec: str, records: dict[str, list[dict[str, str]]] | None = None,
               **kwargs):
    self._spec = json.loads(spec)
    self._records = records
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        disable_shuffling=True,
        description=f"jtc {self._spec['format']} dataset {self._spec['splits']}",
        features=tfds.features.FeaturesDict({k: tfds.features.Text() for k in formats.RECORD_FIELDS
                                            }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    records = self._records or _read_spec(self._spec)
    return {split: self._generate_examples(rs) for split, rs in records.items()}

  def _generate_examples(self, records):
    for i, record in enumerate(records):
      yield i, record


def _read_spec(spec: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
  """Every split of a ``_files_spec``, read and checked."""
  source = formats.Source(spec['path'], spec['format'], {
      s: tuple(files) for s, files in spec['splits'].items()
  })
  return formats.read_source(source, question_field=spec['question_field'],
                             answer_field=spec['answer_field'])


# 0.2's names (CHANGELOG's table of moved names): JSONL reading now lives in `jtc.data.formats`.
JtcJsonl = JtcFiles
normalize_reference_answer = formats.normalize_reference_answer


def read_jsonl(path: str, *, question_key: str | None = None,
               answer_key: str | None = None) -> list[dict[str, str]]:
  """The records of one JSONL file: `formats.read_files` under its 0.2 name."""
  return formats.read_files('jsonl', [path], question_field=question_key or '',
                            answer_field=answer_key or '')


_BUILDERS = {'jtc_synthetic': JtcSynthetic, 'jtc_files': JtcFiles}

_LAYOUT_VERSION = 4  # bump when the stored layout/order changes, so old caches are not reused


def _spec_key(spec: dict[str, Any]) -> str:
  keyed = {'layout': _LAYOUT_VERSION, **spec}
  return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]


def _resolve(
    source: str,
    *,
    task_kwargs: dict[str, Any] | None,
    data_seed: int,
    num_examples: dict[str, int] | None,
    question_field: str,
    answer_field: str,
) -> tuple[str, str, str]:
  """-> (builder name, folder slug, spec JSON) for a task name or a dataset path."""
  if source in tasks_lib.TASKS:
    task = tasks_lib.get_task(source, **(task_kwargs or {}))  # validates the knobs now
    sizes = dict(DEFAULT_NUM_EXAMPLES if num_examples is None else num_examples)
    bad = [s for s in sizes if s not in tasks_lib.SPLITS]
    if bad:
      raise ValueError(f'unknown splits {bad} in num_examples; valid: {list(tasks_lib.SPLITS)}')
    config = task.config()
    spec = {
        'task': config.pop('name'),
        'task_kwargs': json.loads(json.dumps(config)),
        'seed': int(data_seed),
        'num_examples': sizes,
    }
    return 'jtc_synthetic', source, json.dumps(spec, sort_keys=True)
  if os.path.exists(source) or file_lists.is_list(source):
    found = formats.detect(source)
    files = [p for paths in found.splits.values() for p in paths]
    spec = {
        'path': found.path,
        'format': found.format,
        'splits': found.splits,
        'stamps': {
            p: [os.path.getsize(p), os.stat(p).st_mtime_ns] for p in files
        },
        'question_field': question_field,
        'answer_field': answer_field,
    }
    first = os.path.basename(files[0] if len(files) > 1 else found.path)
    slug = re.sub(r'[^A-Za-z0-9_]+', '_',
                  first + (f'_and_{len(files) - 1}' if ',' in found.path else ''))
    return 'jtc_files', f'{found.format}_{slug}', json.dumps(spec, sort_keys=True)
  raise ValueError(
      f'unknown task or dataset {source!r}; valid: tasks {sorted(tasks_lib.TASKS)} or a path to a '
      'JSONL or parquet file (or a comma-separated list and glob patterns of them), a directory of <split>.jsonl / <split>.parquet files or a Hugging '
      'Face dataset saved with save_to_disk')


def prepare(
    source: str,
    *,
    data_dir: str | None = None,
    task_kwargs: dict[str, Any] | None = None,
    data_seed: int = 0,
    num_examples: dict[str, int] | None = None,
    question_field: str = '',
    answer_field: str = '',
) -> dict[str, Any]:
  """Builds the array_record files once (no-op when present) and returns ``tfds.data_source`` kwargs.

    Args:
      source: a task name in ``jtc.data.tasks.TASKS`` or a dataset path of `jtc.data.formats` (a
        file is split ``'train'``).
      data_dir: cache root (default ``default_data_dir()``).
      task_kwargs: knobs of the synthetic task (e.g. ``{'digits_a': 3}``).
      data_seed: generation seed of a synthetic task (the problems; not the shuffle order).
      num_examples: ``{split: count}`` for a synthetic task (default ``DEFAULT_NUM_EXAMPLES``).
      question_field, answer_field: a dataset's question/answer field names (`formats`; default
        '': detected).

    Returns:
      ``{'name', 'data_dir', 'builder_kwargs'}`` for ``tfds.data_source(**it, split=...)``.
    """
  name, slug, spec = _resolve(
      source,
      task_kwargs=task_kwargs,
      data_seed=data_seed,
      num_examples=num_examples,
      question_field=question_field,
      answer_field=answer_field,
  )
  root = os.path.join(data_dir or default_data_dir(), f'{slug}-{_spec_key(json.loads(spec))}')
  with files_lib.reading(root, PREPARED):
    prepared = _is_prepared(_BUILDERS[name](spec=spec, data_dir=root, file_format='array_record'))
  if not prepared:
    # A dataset is read and checked now, before TFDS starts (and before taking the lock).
    records = _read_spec(json.loads(spec)) if name == 'jtc_files' else None
    kwargs = {'records': records} if records is not None else {}
    parent, folder = os.path.split(root)
    os.makedirs(parent, exist_ok=True)
    with _file_lock(os.path.join(parent, f'.{folder}.lock')):
      # Built anew under the lock: another process may have finished while we waited.
      builder = _BUILDERS[name](spec=spec, data_dir=root, file_format='array_record', **kwargs)
      if not _is_prepared(builder):
        _quiet_prepare(builder, rebuild=lambda: _BUILDERS[name](spec=spec, data_dir=root))
  return {'name': name, 'data_dir': root, 'builder_kwargs': {'spec': spec}}


def _is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
  """``builder.is_prepared()`` without TFDS's "has no dataset_info.json" warning on a fresh dir.

    TFDS renames a fully written ``incomplete.*`` folder to ``builder.data_dir`` in one step, so
    an existing folder is a finished one.
    """
  return os.path.isdir(builder.data_dir) and builder.is_prepared()


@contextlib.contextmanager
def _file_lock(path: str):
  """Holds an exclusive ``fcntl.flock`` on ``path`` (created if missing) inside the block, and
    removes the file when the block exits (no ``.lock`` is left in the data directory).

    The lock is released when the block exits or the process dies, so a killed preparer never
    blocks the next one (its half-written ``incomplete.*`` folder is simply not used). A waiter
    that locked a file its holder removed meanwhile locks the path's new file instead. On a file
    system without ``flock`` (some network mounts) it warns and runs the block unlocked;
    ``_quiet_prepare`` then still tolerates losing the race.
    """
  while True:
    f = open(path, 'a')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    except OSError as e:
      logging.warning('jtc.data.pipeline: cannot lock %s (%s); preparing without a lock', path, e)
      f.close()
      yield
      return
    try:
      if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
        break
    except FileNotFoundError:
      pass
    f.close()  # its holder removed it meanwhile: lock the path's new file
  try:
    yield
  finally:
    try:
      os.remove(path)
    except FileNotFoundError:
      pass
    f.close()


def _quiet_prepare(builder: tfds.core.DatasetBuilder, *, rebuild) -> None:
  """``download_and_prepare`` without TFDS's download lines and progress bars on stdout.

    Nothing here is downloaded (the records are generated or read from local files), so TFDS's
    "Downloading and preparing dataset ..." is misleading; it prints it with ``print`` to
    stdout, which is captured here and replaced by one INFO log line. If another process
    renamed its finished folder into place first (only possible without the lock), the failed
    rename (TFDS's ``FileExistsError``, or the ``OSError`` "Directory not empty" when both
    renames race) is ignored when ``rebuild()`` (a fresh builder) finds the dataset prepared.
    """
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare()
  except OSError:  # FileExistsError is one
    if not _is_prepared(rebuild()):
      raise
    return
  logging.info('jtc.data.pipeline: generated %s records in %s', builder.name, builder.data_dir)


def decode(example: dict[str, Any]) -> dict[str, Any]:
  """bytes -> str, recursively (TFDS Text features come back as bytes without TensorFlow)."""
  out = {}
  for k, v in example.items():
    if isinstance(v, dict):
      out[k] = decode(v)
    elif isinstance(v, (bytes, np.bytes_)):
      out[k] = bytes(v).decode('utf-8')
    else:
      out[k] = v
  return out


def data_source(source: str, *, split: str, data_dir: str | None, **prepare_kwargs: Any):
  """``tfds.data_source`` over the prepared split; unknown split -> ValueError listing them."""
  kwargs = prepare(source, data_dir=data_dir, **prepare_kwargs)
  with files_lib.reading(kwargs['data_dir'], PREPARED):
    builder = _BUILDERS[kwargs['name']](data_dir=kwargs['data_dir'], file_format='array_record',
                                        **kwargs['builder_kwargs'])
    available = sorted(builder.info.splits)
    records = builder.as_data_source(split=split) if split in available else None
    if records and None in {**records[0], **records[len(records) - 1]}.values():  # read now
      raise RuntimeError('its first or last record reads as empty fields (cut off?)')
  if split not in available:
    raise ValueError(f'unknown split {split!r} for {source!r}; valid: {available}')
  if len(records) == 0:
    raise ValueError(f'empty dataset: split {split!r} of {source!r} has no records')
  return records
