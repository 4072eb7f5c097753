"""Reading back the files jtc writes (JSON, JSONL, npz, msgpack), so that a damaged one fails by
name.

Every reader raises `DamagedFile` naming the file, what it should hold and what it holds
instead (empty, cut off, not text, not JSON, not an npz archive, keys missing). `DamagedFile` is
a ValueError, so every command's one-line error handling prints it. Nothing here falls back to
a default or needs ``allow_pickle``: an npz is read with pickles refused, a msgpack file with
msgpack's own decoder.
"""

import contextlib
import json
import os
import sys
import zipfile

import numpy as np

ZIP_MAGIC = b'PK\x03\x04'  # an npz archive is a zip file


class DamagedFile(ValueError):
  """A file that is not what jtc wrote there (empty, truncated, overwritten)."""

  def __init__(self, path, expected, found, hint='it was left as it is'):
    super().__init__(f'damaged file {path}: expected {expected}, but {found}. It looks '
                     f'truncated or overwritten; {hint}')
    self.path = path


@contextlib.contextmanager
def report_damage():
  """Around a command's main: a `DamagedFile` ends it with its one line and exit status 1, not
  a traceback."""
  try:
    yield
  except DamagedFile as e:
    sys.exit(f'error: {e}')


@contextlib.contextmanager
def reading(path, expected, hint='it was left as it is'):
  """Any error inside the block (a library reading ``path`` its own way, with its own error
  types) as a `DamagedFile` naming ``path``."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    raise DamagedFile(path, expected, f'it cannot be read ({type(e).__name__}: {reason})',
                      hint) from None


def read_bytes(path, expected):
  """The bytes of ``path``; DamagedFile when it is empty."""
  with open(path, 'rb') as f:
    data = f.read()
  if not data:
    raise DamagedFile(path, expected, 'it is empty')
  return data


def decode_text(path, data, expected):
  """``data`` (the content of ``path``) as UTF-8 text, or DamagedFile naming the line."""
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b'\n') + 1
    raise DamagedFile(path, expected, f'it is not text (line {line}, byte {e.start} is not '
                      'UTF-8)') from None


def read_text(path, expected):
  """The UTF-8 text of ``path``; DamagedFile when it is empty or not text."""
  return decode_text(path, read_bytes(path, expected), expected)


def parse_json(path, text, expected):
  """``text`` (the content of ``path``) as JSON, or DamagedFile saying where it breaks."""
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    if e.pos >= len(text.rstrip()):
      raise DamagedFile(path, expected, 'it ends in the middle of its JSON (cut off)') from None
    raise DamagedFile(path, expected, f'it is not JSON ({e.msg} at line {e.lineno} column '
                      f'{e.colno})') from None


def check_keys(path, obj, keys, expected):
  """DamagedFile unless ``obj`` is a dict holding every key of ``keys``."""
  if not isinstance(obj, dict):
    raise DamagedFile(path, expected, f'it holds a JSON {type(obj).__name__}, not an object')
  missing = [k for k in keys if k not in obj]
  if missing:
    raise DamagedFile(path, expected, f'it lacks {missing} (it has {sorted(obj)[:8]})')
  return obj


def read_json(path, *, keys=(), expected='a JSON object'):
  """The JSON object in ``path``, which must hold ``keys``."""
  expected = f'{expected} with {list(keys)}' if keys else expected
  obj = parse_json(path, read_text(path, expected), expected)
  return check_keys(path, obj, keys, expected)


def read_jsonl(path, *, expected='one JSON object a line (metrics.jsonl)'):
  """The records of a JSONL file jtc appends to ([] when it does not exist). A last line
  without its newline is one being written, or cut by a kill: it is left out. Any other line
  that is not a JSON object, or a last line that does not even start like one, is damage."""
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    data = f.read()
  text = decode_text(path, data, expected)
  lines = text.split('\n')
  torn = lines.pop()  # '' when the file ends with a newline
  if torn and not torn.startswith('{'):
    raise DamagedFile(path, expected, f'its last line starts with {torn[:20]!r}')
  records = []
  for number, line in enumerate(lines, start=1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise DamagedFile(path, expected, f'line {number} is not JSON ({e.msg})') from None
    if not isinstance(record, dict):
      raise DamagedFile(path, expected, f'line {number} holds a {type(record).__name__}')
    records.append(record)
  return records


def read_npz(path, *, keys=(), expected='an npz archive of arrays'):
  """{name: array} of an npz archive written by `np.savez*`, which must hold ``keys``; every
  array is read here (a damaged member fails now, not when used), pickles refused."""
  expected = f'{expected} with {list(keys)}' if keys else expected
  if read_bytes(path, expected)[:4] != ZIP_MAGIC:
    raise DamagedFile(path, expected, 'it is not an npz (zip) archive')
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
  except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
    raise DamagedFile(path, expected,
                      f'it cannot be read as one ({type(e).__name__}: {e})') from None
  missing = [k for k in keys if k not in arrays]
  if missing:
    raise DamagedFile(path, expected, f'it lacks {missing}')
  return arrays


def read_msgpack(path, *, expected='msgpack-serialised parameters'):
  """The state dict of a file written by `flax.serialization.to_bytes` / `msgpack_serialize`."""
  from flax import serialization  # pylint: disable=import-outside-toplevel
  data = read_bytes(path, expected)
  try:
    state = serialization.msgpack_restore(data)
  except Exception as e:  # pylint: disable=broad-except
    # msgpack reports a damaged stream with several exception types (ExtraData, ValueError,
    # TypeError, ...).
    raise DamagedFile(path, expected, f'it does not decode ({type(e).__name__}: {e})') from None
  if not isinstance(state, dict):
    raise DamagedFile(path, expected, f'it decodes to a {type(state).__name__}, not a dict')
  return state


def restore_tree(path, template, state, *, expected='parameters'):
  """``state`` (from `read_msgpack`) as a pytree shaped like ``template``: DamagedFile when its
  structure or any array's shape differs."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import serialization  # pylint: disable=import-outside-toplevel
  try:
    tree = serialization.from_state_dict(template, state)
  except (ValueError, KeyError, TypeError) as e:
    raise DamagedFile(path, expected, f'its arrays are not those ({e})') from None
  bad = [(jax.tree_util.keystr(p), getattr(x, 'shape', None), t.shape)
         for (p, x), t in zip(jax.tree_util.tree_leaves_with_path(tree),
                              jax.tree_util.tree_leaves(template))
         if getattr(x, 'shape', None) != t.shape]
  if bad:
    raise DamagedFile(
        path, expected, f'{len(bad)} arrays have other shapes, e.g. {bad[0][0]}: '
        f'{bad[0][1]} stored, {bad[0][2]} expected')
  return tree
