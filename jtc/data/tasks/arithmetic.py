"""Multi-digit arithmetic whose solutions come in three equally rewarded surface forms.

Prompt: ``"What is 23+58?"`` (ops ``+ - *``, ASCII ``*`` for times). Solution formats:

- ``answer``:   ``"The answer is 81."``        -- template tokens shared by every problem
- ``equation``: ``"23+58=81."``                -- restates the problem (paper App. A, "10+10=20.")
- ``steps``:    ``"23+50=73,73+8=81,so 81."``  -- short place-value chain of thought

``steps`` splits the second operand into its non-zero place-value parts (``58 -> 50, 8``) and
adds/subtracts them one by one; for ``*`` it lists the partial products (of the operand with more
non-zero digits) and concludes with their sum: ``"23*7"`` -> ``"20*7=140,3*7=21,so 161."``.
Every steps solution ends in ``",so N."``, so the three formats never coincide.

The reward is format-independent: ``rewards.extract_answer`` (``answer is`` or else the last
number) compared exactly with the reference, so all three formats of a correct answer get 1.0.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from jtc.data import rewards
from jtc.data.tasks import base

FORMATS = ('answer', 'equation', 'steps')
OPS = ('+', '-', '*')
_APPLY = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}

_NUM = r'-?\d+'
_CLAUSE = rf'{_NUM}[+\-*]\d+={_NUM}'
_FORMAT_RES = {
    'answer': re.compile(rf'The answer is {_NUM}\.?'),
    'equation': re.compile(rf'{_NUM}[+\-*]\d+={_NUM}\.?'),
    'steps': re.compile(rf'{_CLAUSE}(?:,{_CLAUSE})*,so {_NUM}\.?'),
}


def place_parts(n: int) -> list[int]:
  """Non-zero place-value parts of n >= 0, highest first: 508 -> [500, 8]; 0 -> [0]."""
  parts = [int(d) * 10**i for i, d in enumerate(reversed(str(n))) if d != '0']
  return list(reversed(parts)) or [0]


def render(a: int, op: str, b: int, fmt: str) -> str:
  """The solution text of ``a op b`` in format ``fmt`` (one of ``FORMATS``)."""
  c = _APPLY[op](a, b)
  if fmt == 'answer':
    return f'The answer is {c}.'
  if fmt == 'equation':
    return f'{a}{op}{b}={c}.'
  if fmt == 'steps':
    if op == '*':
      if len(place_parts(b)) >= len(place_parts(a)):
        clauses = [f'{a}*{p}={a * p}' for p in place_parts(b)]
      else:
        clauses = [f'{p}*{b}={p * b}' for p in place_parts(a)]
    else:
      clauses, acc = [], a
      for p in place_parts(b):
        nxt = _APPLY[op](acc, p)
        clauses.append(f'{acc}{op}{p}={nxt}')
        acc = nxt
    return ','.join(clauses) + f',so {c}.'
  raise ValueError(f'unknown format {fmt!r}; valid: {list(FORMATS)}')


def format_of(completion: str) -> str | None:
  """Names the surface form of a completion (``FORMATS``), or None if it matches none.

    Purely syntactic: a wrong answer in the ``equation`` form is still ``'equation'``.
    """
  if not isinstance(completion, str):
    return None
  text = completion.strip()
  for name, pattern in _FORMAT_RES.items():
    if pattern.fullmatch(text):
      return name
  return None


def _digit_range(d: int) -> tuple[int, int]:
  return (0, 9) if d == 1 else (10**(d - 1), 10**d - 1)


@dataclasses.dataclass(frozen=True)
class ArithmeticTask(base.SampledTask):
  """``a op b`` with ``digits_a``/``digits_b``-digit operands and ``op`` drawn from ``ops``.

    Attributes:
      digits_a: digits of the first operand (difficulty knob).
      digits_b: digits of the second operand.
      ops: operators to draw from, a subset of ``('+', '-', '*')``.
      allow_negative: if False, ``a - b`` is drawn with ``a >= b``.
      test_fraction: share of all problems reserved for the test split.
    """

  digits_a: int = 2
  digits_b: int = 2
  ops: tuple[str, ...] = ('+', '-')
  allow_negative: bool = False
  test_fraction: float = 0.1

  name = 'arithmetic'
  formats = FORMATS
  scaffold = ''

  def __post_init__(self):
    object.__setattr__(self, 'ops', tuple(self.ops))
    bad = [op for op in self.ops if op not in OPS]
    if bad or not self.ops:
      raise ValueError(f'invalid ops {bad or self.ops!r}; valid: {list(OPS)}')
    for field in ('digits_a', 'digits_b'):
      value = getattr(self, field)
      if not isinstance(value, int) or not 1 <= value <= 12:
        raise ValueError(f'{field} must be an int in [1, 12], got {value!r}')
    if not 0.0 < self.test_fraction < 1.0:
      raise ValueError(f'test_fraction must be in (0, 1), got {self.test_fraction}')

  def config(self) -> dict[str, Any]:
    return {'name': self.name, **dataclasses.asdict(self)}

  def problem_key(self, a: int, op: str, b: int) -> str:
    """Canonical key: ``a+b`` and ``b+a`` (likewise ``*``) are the same problem."""
    if op in ('+', '*'):
      a, b = sorted((a, b))
    return f'{a}{op}{b}'

  def make_example(self, a: int, op: str, b: int) -> base.Example:
    return {
        'prompt': f'What is {a}{op}{b}?',
        'answer': str(_APPLY[op](a, b)),
        'solutions': {
            fmt: render(a, op, b, fmt) for fmt in FORMATS
        },
    }

  def _sample(self, rng: np.random.Generator) -> tuple[str, base.Example]:
    a = int(rng.integers(*_digit_range(self.digits_a), endpoint=True))
    b = int(rng.integers(*_digit_range(self.digits_b), endpoint=True))
    op = self.ops[int(rng.integers(len(self.ops)))]
    if op == '-' and not self.allow_negative and a < b:
      a, b = b, a
    return self.problem_key(a, op, b), self.make_example(a, op, b)

  def reward_fn(self, prompts: Sequence[str], completions: Sequence[str],
                answers: Sequence[str]) -> np.ndarray:
    """1.0 iff the extracted answer equals the reference number, whatever the format. [B] f32."""
    return rewards.numeric_match(prompts, completions, answers)

  def format_of(self, completion: str) -> str | None:
    return format_of(completion)
