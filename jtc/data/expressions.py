"""A safe exact evaluator for arithmetic expressions (never ``eval``).

A small tokenizer and recursive-descent parser over ``fractions.Fraction`` with limits on
length, nesting depth, exponent size and the bit size of every intermediate value, so no input
(model output included) can hang it. Used by the ``expression_match`` verifier and the
countdown task.
"""
from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 256  # longer expressions are rejected, not parsed
MAX_EXPRESSION_DEPTH = 32  # nested parentheses / unary signs / powers
MAX_EXPONENT = 16  # |e| in a ** e
MAX_VALUE_BITS = 4096  # numerator and denominator bit length of every intermediate value


class ExpressionError(ValueError):
  """An expression that is malformed, too big, too deep, or divides by zero."""


@dataclasses.dataclass(frozen=True)
class ParsedExpression:
  """Result of ``parse_expression``: the exact value and the literals in reading order."""

  value: Fraction
  numbers: tuple[Fraction, ...]


_TOKEN_RE = re.compile(r'\s*(?:(\d+(?:\.\d+)?|\.\d+)|(\*\*|[-+*/()^×÷xX]))')
_OP_ALIASES = {'×': '*', 'x': '*', 'X': '*', '÷': '/', '^': '**'}


def _tokenize_expression(text: str) -> list[tuple[str, str]]:
  tokens = []
  pos = 0
  n = len(text.rstrip())
  while pos < n:
    m = _TOKEN_RE.match(text, pos)
    if m is None or m.end() == pos:
      bad = text[pos:].lstrip()[:1]
      raise ExpressionError(f'unexpected character {bad!r} at position {pos} in {text!r}')
    if m.group(1) is not None:
      if len(m.group(1)) > 40:
        raise ExpressionError(f'number literal too long in {text!r}')
      tokens.append(('num', m.group(1)))
    else:
      op = m.group(2)
      tokens.append(('op', _OP_ALIASES.get(op, op)))
    pos = m.end()
  return tokens


def _check_size(value: Fraction) -> Fraction:
  if value.numerator.bit_length() > MAX_VALUE_BITS or value.denominator.bit_length(
  ) > MAX_VALUE_BITS:
    raise ExpressionError(f'intermediate value exceeds {MAX_VALUE_BITS} bits')
  return value


class _Parser:
  """Recursive descent over: expr := term (+|- term)*; term := unary (*|/ unary)*;
    unary := (+|-) unary | power; power := atom [** unary]; atom := NUMBER | ( expr )."""

  def __init__(self, tokens, *, allow_unary: bool, allow_power: bool, max_depth: int):
    self.tokens = tokens
    self.i = 0
    self.numbers: list[Fraction] = []
    self.allow_unary = allow_unary
    self.allow_power = allow_power
    self.max_depth = max_depth

  def peek(self):
    return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

  def take(self):
    tok = self.peek()
    self.i += 1
    return tok

  def expr(self, depth):
    value = self.term(depth)
    while self.peek() in (('op', '+'), ('op', '-')):
      op = self.take()[1]
      rhs = self.term(depth)
      value = _check_size(value + rhs if op == '+' else value - rhs)
    return value

  def term(self, depth):
    value = self.unary(depth)
    while self.peek() in (('op', '*'), ('op', '/')):
      op = self.take()[1]
      rhs = self.unary(depth)
      if op == '*':
        value = _check_size(value * rhs)
      else:
        if rhs == 0:
          raise ExpressionError('division by zero')
        value = _check_size(value / rhs)
    return value

  def unary(self, depth):
    if depth > self.max_depth:
      raise ExpressionError(f'expression nested deeper than {self.max_depth}')
    if self.peek() in (('op', '+'), ('op', '-')):
      if not self.allow_unary:
        raise ExpressionError('unary sign not allowed')
      op = self.take()[1]
      value = self.unary(depth + 1)
      return -value if op == '-' else value
    return self.power(depth)

  def power(self, depth):
    base = self.atom(depth)
    if self.peek() == ('op', '**'):
      if not self.allow_power:
        raise ExpressionError('power not allowed')
      self.take()
      exponent = self.unary(depth + 1)
      if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
        raise ExpressionError(f'exponent must be an integer with |e| <= {MAX_EXPONENT}')
      if base == 0 and exponent < 0:
        raise ExpressionError('division by zero')
      if base.numerator.bit_length() * abs(int(exponent)) > MAX_VALUE_BITS or (
          base.denominator.bit_length() * abs(int(exponent)) > MAX_VALUE_BITS):
        raise ExpressionError(f'power exceeds {MAX_VALUE_BITS} bits')
      return _check_size(base**int(exponent))
    return base

  def atom(self, depth):
    kind, val = self.take()
    if kind == 'num':
      number = Fraction(val)
      self.numbers.append(number)
      return number
    if (kind, val) == ('op', '('):
      if depth + 1 > self.max_depth:
        raise ExpressionError(f'expression nested deeper than {self.max_depth}')
      value = self.expr(depth + 1)
      if self.take() != ('op', ')'):
        raise ExpressionError("missing ')'")
      return value
    raise ExpressionError(f'unexpected token {val!r}' if val is not None else 'unexpected end')


def parse_expression(
    text: str,
    *,
    allow_unary: bool = True,
    allow_power: bool = True,
    max_length: int = MAX_EXPRESSION_CHARS,
    max_depth: int = MAX_EXPRESSION_DEPTH,
) -> ParsedExpression:
  """Safely evaluates an arithmetic expression exactly (never ``eval``).

    Grammar: numbers (``12``, ``1.5``), ``+ - * /`` (also ``× ÷ x``), ``**`` or ``^`` (integer
    exponent, |e| <= ``MAX_EXPONENT``), parentheses, unary ``+``/``-``. Values are
    ``Fraction``; every intermediate value is bounded to ``MAX_VALUE_BITS`` bits.

    Raises:
      ExpressionError (a ``ValueError``) for malformed, too long, too deep or too large input
      and for division by zero.
    """
  if not isinstance(text, str):
    raise ExpressionError(f'expression must be a string, got {type(text).__name__}')
  if len(text) > max_length:
    raise ExpressionError(f'expression longer than {max_length} characters')
  tokens = _tokenize_expression(text)
  if not tokens:
    raise ExpressionError('empty expression')
  parser = _Parser(tokens, allow_unary=allow_unary, allow_power=allow_power, max_depth=max_depth)
  value = parser.expr(0)
  if parser.i != len(tokens):
    raise ExpressionError(f'unexpected token {tokens[parser.i][1]!r} in {text!r}')
  return ParsedExpression(value=value, numbers=tuple(parser.numbers))


def evaluate_expression(text: str, **kwargs) -> Fraction:
  """``parse_expression(text, **kwargs).value``."""
  return parse_expression(text, **kwargs).value
