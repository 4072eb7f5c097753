"""Validation helpers: every bad setting fails before any compute, naming the key, the value and
what is valid. Each module checks the settings it consumes with these."""

import difflib


def choice(key, value, valid):
  """``value`` must be one of ``valid``."""
  if value not in valid:
    raise ValueError(f'{key}={value!r} is not valid; valid: {sorted(valid)}')


def positive(key, value):
  """``value`` must be a number > 0."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ValueError(f'{key}={value!r} must be > 0')


def positive_int(key, value):
  """``value`` must be an int >= 1."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f'{key}={value!r} must be an int >= 1')


def group_size(value, batch):
  """``value`` (G) must be an int >= 1 dividing the batch size ``batch`` (groups are contiguous
  rows of G)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1 or batch % value:
    raise ValueError(f'group_size={value!r} must be a positive int dividing B={batch}')


def in_range(key, value, *, low=None, high=None, low_open=False, high_open=False, integer=False):
  """``value`` must lie in the interval [low, high] (open where asked; None = unbounded)."""
  kind = int if integer else (int, float)
  ok = not isinstance(value, bool) and isinstance(value, kind)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value < high if high_open else value <= high
  if not ok:
    lo = '-inf' if low is None else f'{low}'
    hi = 'inf' if high is None else f'{high}'
    interval = f'{"(" if low_open or low is None else "["}{lo}, {hi}{")" if high_open or high is None else "]"}'
    raise ValueError(f'{key}={value!r} must be {"an int" if integer else "a number"} in {interval}')


def nearest(name, valid, n=3):
  """A hint naming the valid names closest to ``name`` (for unknown keys)."""
  close = difflib.get_close_matches(name, list(valid), n=n, cutoff=0.5)
  return f'; did you mean {", ".join(repr(c) for c in close)}?' if close else ''


def flatten(tree, prefix=''):
  """{'a.b': value} for every leaf of a nested dict (a config's ``to_dict()``)."""
  out = {}
  for k, v in tree.items():
    out.update(flatten(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


def assignments(flag, text):
  """``'k=v,k2=v2'`` (a command's --hparams) as {k: v}, each value a Python literal (number,
  True / False / None, quoted string) or else its text; ValueError naming ``flag`` and the bad
  item."""
  import ast  # pylint: disable=import-outside-toplevel
  out = {}
  for item in filter(None, (text or '').split(',')):
    key, eq, value = item.partition('=')
    if not eq or not key.strip():
      raise ValueError(f'{flag} {item!r}: expected key=value[,key=value...]')
    try:
      out[key.strip()] = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      out[key.strip()] = value.strip()
  return out
