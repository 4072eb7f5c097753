"""One code style for the repository: the yapf style in ``.style.yapf`` and single quotes.

Fix a failure with ``yapf -i -p $(git ls-files '*.py')``; the quote rule (Google style) is: a
one-line string literal uses single quotes unless its text contains a single quote.
"""
import io
import os
import subprocess
import tokenize

import pytest
from yapf.yapflib import yapf_api

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STYLE = os.path.join(REPO, '.style.yapf')


def _python_files() -> list[str]:
  """The tracked and untracked-but-not-ignored ``*.py`` files (what a commit would hold)."""
  try:
    out = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '*.py'],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip('not a git checkout')
  return sorted(p for p in out.split() if os.path.isfile(os.path.join(REPO, p)))


def double_quoted_strings(source: str) -> list[tuple[int, str]]:
  """(line, literal) of every one-line double-quoted string that could be single-quoted."""
  found = []
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type != tokenize.STRING or tok.start[0] != tok.end[0]:
      continue
    body = tok.string.lstrip('rRbBuUfF')
    if body.startswith('"') and not body.startswith('"""') and "'" not in body:
      found.append((tok.start[0], tok.string))
  return found


def test_double_quote_check_finds_a_known_positive():
  src = 'a = "x"\nb = \'y\'\nc = "it\'s"\nd = """doc"""\ne = f"{a}"\n'
  assert double_quoted_strings(src) == [(1, '"x"'), (5, 'f"{a}"')]


def test_yapf_check_finds_a_known_positive():
  _, changed = yapf_api.FormatCode('def f( x ):\n    return x\n', style_config=STYLE)
  assert changed


SHARDS = 4  # the files split in shards that pytest-xdist's workers share (yapf takes a minute)


@pytest.mark.parametrize('shard', range(SHARDS))
def test_every_python_file_is_formatted(shard):
  unformatted = []
  for path in _python_files()[shard::SHARDS]:
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
      source = f.read()
    _, changed = yapf_api.FormatCode(source, style_config=STYLE)
    if changed and source:  # yapf 'formats' an empty file to one newline
      unformatted.append(path)
  assert not unformatted, f'run `yapf -i -p` on: {unformatted}'


def test_one_line_strings_use_single_quotes():
  offenders = []
  for path in _python_files():
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
      offenders += [f'{path}:{line} {lit}' for line, lit in double_quoted_strings(f.read())]
  assert not offenders, '\n'.join(offenders[:20])
