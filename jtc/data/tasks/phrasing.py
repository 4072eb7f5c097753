"""Arithmetic whose equivalent solutions are equally rewarded AND equally easy by construction.

Every solution is the same place-value chain of thought after a fixed scaffold, then the final
answer in one of three interchangeable phrasings of equal length (13 characters):

  "Work: 23+50=73,73+8=81. The answer is 81."
  "Work: 23+50=73,73+8=81. The result is 81."
  "Work: 23+50=73,73+8=81. Final answer: 81."

The reasoning decides correctness; the phrasing only restates its number. So under RL any
systematic movement of the phrasing distribution is reward-irrelevant drift (paper 2604.13088,
Cor. 3.2 / Eq. 41): exchangeable objectives predict none, sequence-coupled weights (GSPO) or
sign-asymmetric clipping predict some. ``SCAFFOLD`` ("Work: ") is written by every completion of
every group, so the learning tax on shared tokens (their log-probability change and the share of
gradient energy they receive) can be measured directly. Equal phrasing lengths keep the
per-token weight 1/|y_i| equal across the correct completions of a group.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from jtc.data import rewards
from jtc.data.tasks import arithmetic
from jtc.data.tasks import base

SCAFFOLD = 'Work: '
PHRASINGS = {'answer': 'The answer is', 'result': 'The result is', 'final': 'Final answer:'}
FORMATS = tuple(PHRASINGS)

_NUM = r'-?\d+'
_CLAUSE = rf'{_NUM}[+\-*]\d+={_NUM}'
_RE = re.compile(rf'{re.escape(SCAFFOLD)}{_CLAUSE}(?:,{_CLAUSE})*\. '
                 rf"({'|'.join(re.escape(p) for p in PHRASINGS.values())}) {_NUM}\.?")
_NAME_OF = {p: name for name, p in PHRASINGS.items()}


def chain(a: int, op: str, b: int) -> str:
  """The place-value chain of thought of ``a op b``: '23+50=73,73+8=81'."""
  return arithmetic.render(a, op, b, 'steps').rsplit(',so ', 1)[0]


def render(a: int, op: str, b: int, fmt: str) -> str:
  """The solution of ``a op b`` with the final answer in phrasing ``fmt`` (``FORMATS``)."""
  if fmt not in PHRASINGS:
    raise ValueError(f'unknown phrasing {fmt!r}; valid: {list(FORMATS)}')
  c = arithmetic._APPLY[op](a, b)  # pylint: disable=protected-access
  return f'{SCAFFOLD}{chain(a, op, b)}. {PHRASINGS[fmt]} {c}.'


def format_of(completion: str) -> str | None:
  """The phrasing of a well-formed completion, or None (purely syntactic)."""
  if not isinstance(completion, str):
    return None
  m = _RE.fullmatch(completion.strip())
  return _NAME_OF[m.group(1)] if m else None


@dataclasses.dataclass(frozen=True)
class PhrasingTask(arithmetic.ArithmeticTask):
  """`ArithmeticTask`'s problems (2-digit ``+`` / ``-``), solutions in equal phrasings."""

  name = 'phrasing'
  formats = FORMATS
  scaffold = SCAFFOLD

  def make_example(self, a: int, op: str, b: int) -> base.Example:
    return {
        'prompt': f'What is {a}{op}{b}?',
        'answer': str(arithmetic._APPLY[op](a, b)),  # pylint: disable=protected-access
        'solutions': {
            fmt: render(a, op, b, fmt) for fmt in FORMATS
        }
    }

  def reward_fn(self, prompts: Sequence[str], completions: Sequence[str],
                answers: Sequence[str]) -> np.ndarray:
    """1.0 iff the final number equals the reference, whatever the phrasing. [B] f32."""
    return rewards.numeric_match(prompts, completions, answers)

  def format_of(self, completion: str) -> str | None:
    return format_of(completion)
