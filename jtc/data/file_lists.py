"""Several files as one dataset: what ``config.data.dataset`` / ``eval_dataset`` name besides one
path, as verl's ``data.train_files`` / ``data.val_files`` take lists of files.

A list is comma-separated; each item is a file or a glob pattern (``*``, ``?``, ``[...]``), its
matches in sorted order. The files are read in the order named, as one split (`formats.detect`):

  data.dataset='gsm8k/train.parquet,math/train.parquet'
  data.dataset='dapo/part-*.parquet'

A path that exists is never read as a list or a pattern (a file whose name holds a comma or a
``*`` is that file).
"""
from __future__ import annotations

import glob
import os


def is_list(spec: str) -> bool:
  """True when ``spec`` names files by a list or a pattern rather than one existing path."""
  spec = os.fspath(spec)
  return not os.path.exists(spec) and (',' in spec or glob.has_magic(spec))


def expand(spec: str) -> tuple[str, ...]:
  """The absolute paths of the files ``spec`` names, in order (each pattern's matches sorted).

    Raises:
      ValueError naming the item that names no file (a missing path, a pattern that matches
      none), a directory (a list names files), or a file named twice.
    """
  files = []
  for item in (s.strip() for s in os.fspath(spec).split(',')):
    if not item:
      raise ValueError(f'{spec!r}: an empty item in the list (a comma-separated list of files '
                       'and glob patterns)')
    matches = sorted(
        glob.glob(item)) if glob.has_magic(item) and not os.path.exists(item) else [item]
    if not matches or not os.path.exists(matches[0]):
      what = 'matches no file' if glob.has_magic(item) else 'is not found'
      raise ValueError(f'{spec!r}: {item!r} {what} (a list names files and glob patterns)')
    for path in map(os.path.abspath, matches):
      if os.path.isdir(path):
        raise ValueError(f'{spec!r}: {path} is a directory; a list names files (a directory is '
                         'a dataset alone)')
      if path in files:
        raise ValueError(f'{spec!r}: names {path} twice (its rows would be read twice)')
      files.append(path)
  return tuple(files)
