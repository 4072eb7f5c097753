"""One dimension key for jtc/: every shape suffix of a name in jtc/ (``logps_BT``, a dataclass's
``tokens_BL``) uses only the letters of docs/dimensions.md's table, and every module that has
such names points to the table from its docstring."""
import ast
import glob
import io
import os
import re
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUFFIXED = re.compile(r'[a-z][a-z0-9]*(?:_[a-z0-9]+)*_([A-Z]{1,7})')


def table_letters(markdown):
  """The letters of the table's first column."""
  return set(re.findall(r'^\| ([A-Z]) \|', markdown, re.M))


def suffix_letters(source):
  """The shape-suffix letters of the names (not strings or comments) in ``source``."""
  names = [
      t.string
      for t in tokenize.generate_tokens(io.StringIO(source).readline)
      if t.type == tokenize.NAME
  ]
  return {c for n in names if (m := SUFFIXED.fullmatch(n)) for c in m.group(1)}


def problems(sources, letters):
  """'path: ...' for each module using a letter outside ``letters`` or not pointing to the
  table."""
  out = []
  for path, source in sources.items():
    used = suffix_letters(source)
    if used - letters:
      out.append(f'{path}: letters {sorted(used - letters)} are not in docs/dimensions.md')
    if used and 'docs/dimensions.md' not in (ast.get_docstring(ast.parse(source)) or ''):
      out.append(f'{path}: its docstring does not point to docs/dimensions.md')
  return out


def _table():
  with open(os.path.join(REPO, 'docs', 'dimensions.md')) as f:
    return table_letters(f.read())


def test_the_table_has_one_row_per_letter():
  with open(os.path.join(REPO, 'docs', 'dimensions.md')) as f:
    rows = re.findall(r'^\| ([A-Z]) \|', f.read(), re.M)
  assert len(rows) == len(set(rows)) and {'B', 'G', 'T', 'N', 'K', 'E', 'U', 'X'} <= set(rows)


def test_an_unknown_letter_and_a_missing_pointer_are_found():
  good = '"""x.\n\nDimension key (docs/dimensions.md): B, T."""\nlogps_BT = 1\n'
  assert problems({'good.py': good}, {'B', 'T'}) == []
  assert suffix_letters('"""d."""\nx_BO = 1  # y_QQ in a comment\ns = "z_VV"\n') == {'B', 'O'}
  assert problems({'bad.py': '"""d."""\nx_BO = 1\n'}, {'B'}) == [
      "bad.py: letters ['O'] are not in docs/dimensions.md",
      'bad.py: its docstring does not point to docs/dimensions.md'
  ]


def test_every_module_of_jtc_uses_the_table():
  sources = {}
  for path in glob.glob(os.path.join(REPO, 'jtc', '**', '*.py'), recursive=True):
    with open(path) as f:
      sources[os.path.relpath(path, REPO)] = f.read()
  assert not problems(sources, _table())
