"""CHANGELOG.md's table of retired 0.1 import paths is true of the code: every name it lists is
in the module it names, and no 0.1 module path that is not a module of 0.2 still imports."""
import importlib
import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r'^\| `(jtc[\w.]*)` \| `(jtc[\w.]*)` \| (.*) \|$')
NAME = re.compile(r'`(\w+)`(?:\s*→\s*`(\w+)`)?')


def moved_names(text):
  """[(old module, new module, [names in the new module])] of the table's rows; a name written
  `a` → `b` is `b` in the new module."""
  rows = []
  for line in text.splitlines():
    m = ROW.match(line)
    if m:
      rows.append((m[1], m[2], [new or old for old, new in NAME.findall(m[3])]))
  return rows


def _rows():
  with open(os.path.join(REPO, 'CHANGELOG.md')) as f:
    return moved_names(f.read())


def _is_module(name):
  try:
    return importlib.util.find_spec(name) is not None
  except ModuleNotFoundError:  # a parent package is missing
    return False


def test_the_table_parser_reads_a_known_row():
  text = 'prose\n| `jtc.a` | `jtc.b.c` | `x`, `y_z` → `w`, `K` |\n| not | a row |'
  assert moved_names(text) == [('jtc.a', 'jtc.b.c', ['x', 'w', 'K'])]
  # The check below would have caught 0.1's broken alias: jtc.model pointed at jtc.models.model,
  # which does not have sequence_logprobs.
  assert not hasattr(importlib.import_module('jtc.models.model'), 'sequence_logprobs')


def test_the_table_covers_the_retired_modules():
  old = {o for o, _, _ in _rows()}
  assert {'jtc.model', 'jtc.sampler', 'jtc.surrogates', 'jtc.update', 'jtc.cli'} <= old
  assert len(_rows()) > 40


@pytest.mark.parametrize('old,new,names', _rows(), ids=lambda x: x if isinstance(x, str) else '')
def test_every_listed_name_is_in_its_new_home(old, new, names):
  module = importlib.import_module(new)
  missing = [n for n in names if not hasattr(module, n)]
  assert not missing, f'CHANGELOG.md: {old} -> {new} lists {missing}, which {new} does not have'


def test_retired_module_paths_no_longer_import():
  still = [o for o, _, _ in _rows() if _is_module(o)]
  # The 0.1 modules whose path is a 0.2 package or command of another content.
  assert set(still) <= {
      'jtc.analysis', 'jtc.data', 'jtc.objectives', 'jtc.plot', 'jtc.sft', 'jtc.train', 'jtc.cli'
  }
  assert not _is_module('jtc.model') and not _is_module('jtc.sampler')
