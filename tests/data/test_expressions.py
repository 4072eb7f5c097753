"""Tests of jtc.data.expressions: the bounded parser against a tree reference (hypothesis),
precedence and associativity, and the inputs it rejects without hanging."""
import time
from fractions import Fraction

import hypothesis
import hypothesis.strategies as st
import pytest

from jtc.data import expressions

FUZZ = hypothesis.settings(max_examples=150, deadline=1000, derandomize=True)


def _tree(depth):
  leaf = st.integers(0, 50)
  if depth == 0:
    return leaf
  sub = _tree(depth - 1)
  return st.one_of(leaf, st.tuples(st.sampled_from('+-*/'), sub, sub))


def _ref_value(node):
  if isinstance(node, int):
    return Fraction(node)
  op, a, b = node
  x, y = _ref_value(a), _ref_value(b)
  if op == '/' and y == 0:
    raise ZeroDivisionError
  return {'+': x + y, '-': x - y, '*': x * y, '/': x / y if op == '/' else None}[op]


def _full_parens(node):
  if isinstance(node, int):
    return str(node)
  op, a, b = node
  return f'({_full_parens(a)} {op} {_full_parens(b)})'


@FUZZ
@hypothesis.given(_tree(4))
def test_parser_matches_tree_reference(node):
  text = _full_parens(node)
  try:
    want = _ref_value(node)
  except ZeroDivisionError:
    with pytest.raises(expressions.ExpressionError, match='division by zero'):
      expressions.evaluate_expression(text)
    return
  parsed = expressions.parse_expression(text)
  assert parsed.value == want
  leaves = []

  def collect(n):
    if isinstance(n, int):
      leaves.append(Fraction(n))
    else:
      collect(n[1])
      collect(n[2])

  collect(node)
  assert list(parsed.numbers) == leaves


@pytest.mark.parametrize(
    'text, want',
    [
        ('2+3*4', 14),
        ('(2+3)*4', 20),
        ('10-4-3', 3),  # left associative
        ('48/4/2', 6),
        ('2**3**2', 512),  # right associative power
        ('-2**2', -4),
        ('2^-2', Fraction(1, 4)),
        ('6×7÷2', 21),
        ('1.5*4', 6),
    ],
)
def test_precedence_and_associativity(text, want):
  assert expressions.evaluate_expression(text) == want


@pytest.mark.parametrize(
    'text, kwargs',
    [
        ('1+' * 200 + '1', {}),  # too long
        ('(' * 40 + '1' + ')' * 40, {}),  # too deep
        ('-' * 40 + '1', {}),  # unary chain too deep
        ('9**17', {}),  # exponent too big
        ('(9**16)**16**16', {}),  # value too big
        ('*'.join(['99999999999**16'] * 8), {}),  # ~4700 bits
        ('2**(1/2)', {}),
        ('1/(3-3)', {}),
        ('0**-1', {}),
        ('import os', {}),
        ("__import__('os')", {}),
        ('2+', {}),
        ('(2+3', {}),
        ('2 3', {}),
        ('', {}),
        ('-3+5', {
            'allow_unary': False
        }),
        ('2**3', {
            'allow_power': False
        }),
    ],
)
def test_parser_rejects(text, kwargs):
  start = time.perf_counter()
  with pytest.raises(expressions.ExpressionError):
    expressions.parse_expression(text, **kwargs)
  assert time.perf_counter() - start < 1.0  # a hang guard, not a benchmark
