"""verl's rule-based scorers, written for jtc, so that a curve compares with a verl run's for the
reason of the method alone.

``gsm8k_strict`` is verl's GSM8K scorer (``verl.utils.reward_score.gsm8k``, method ``strict``):
only the last 300 characters of the completion are read; the answer is the LAST ``#### X`` there,
``X`` a run of digits, dots and commas with an optional minus sign, written right after ``#### ``;
commas (and ``$``) are removed and the rest must equal the reference answer AS A STRING: 1.0, else
0.0 (no format credit). Unlike jtc's lenient ``numeric_match`` it scores "3 + 4 = 7", "The answer
is 7" and ``\\boxed{7}`` as 0, and "#### 7.0" against 7 as 0. docs/verifiers.md puts the two side
by side.
"""
import re
from typing import Sequence

import numpy as np

CLIP_CHARS = 300  # verl reads only the end of a completion
_ANSWER_RE = re.compile(r'#### (-?[0-9.,]+)')


def gsm8k_strict_answer(completion: str) -> str | None:
  """The answer verl's strict GSM8K rule reads from ``completion`` (None: no ``#### X``)."""
  found = _ANSWER_RE.findall(str(completion)[-CLIP_CHARS:])
  return found[-1].replace(',', '').replace('$', '') if found else None


def gsm8k_strict(prompts: Sequence[str], completions: Sequence[str],
                 answers: Sequence[str]) -> np.ndarray:
  """[B] float32: 1.0 where `gsm8k_strict_answer` equals the reference string, else 0.0."""
  if not len(prompts) == len(completions) == len(answers):
    raise ValueError(f'prompts, completions and answers must have equal length, got '
                     f'{len(prompts)}, {len(completions)}, {len(answers)}')
  return np.asarray([gsm8k_strict_answer(c) == str(a) for c, a in zip(completions, answers)],
                    np.float32).reshape(len(answers))
