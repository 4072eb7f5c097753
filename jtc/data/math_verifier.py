r"""The ``math_verify`` reward: Hugging Face's Math-Verify checker (the answer checker of verl, TRL
and MaxText) in a pool of worker processes, with a per-answer timeout.

``--config.data.reward=math_verify`` needs the optional ``math-verify`` package
(``pip install -e '.[math]'``); without it the config check refuses the run, naming the extra,
before any compute. The trainer starts one `MathVerifyReward` per run (``data.verify_workers``
processes, ``data.verify_timeout_s`` per answer; `jtc.data.verify_pool`) and closes it at the
end of the run.

Scoring (`math_verify_score`): the reference is parsed as ``\boxed{reference}`` (unless it
already holds a ``\boxed``), the completion with Math-Verify's default extraction (the last
``\boxed{}`` first, else LaTeX or a plain expression found anywhere), and ``verify(reference,
completion)`` decides: symbolic and numeric equality, sets, intervals, equations. Math-Verify's own
signal-based timeouts are off in the workers (they are not thread-safe); the pool's timeout
replaces them. docs/verifiers.md compares it with ``boxed_numeric`` on 200+ hand-labelled pairs.
"""
from __future__ import annotations

import functools
import importlib
import logging
from typing import Callable, Sequence

import numpy as np

from jtc.data import verify_pool

# `pip install -e '.[math]'` installs it (setup.py's extras_require).
EXTRA = 'math'
PACKAGE = 'math_verify'


def require_math_verify() -> None:
  """ValueError naming the extra to install when the math-verify package cannot be imported."""
  try:
    importlib.import_module(PACKAGE)
  except ImportError as e:
    raise ValueError(f"config.data.reward='math_verify' needs the math-verify package, which "
                     f"cannot be imported ({e}): install jtc's '{EXTRA}' extra, "
                     f"pip install -e '.[{EXTRA}]' (or pip install 'math-verify>=0.9')") from None


@functools.lru_cache(maxsize=1)
def _math_verify():
  """(parse, verify), imported once; Math-Verify's 'timeout is disabled' warning silenced (the
    pool enforces the timeout)."""
  module = importlib.import_module(PACKAGE)
  logging.getLogger(PACKAGE).setLevel(logging.ERROR)
  return module.parse, module.verify


@functools.lru_cache(maxsize=4096)
def _parse_reference(answer: str):
  parse, _ = _math_verify()
  text = answer if '\\boxed' in answer else '\\boxed{' + answer + '}'
  return parse(text, parsing_timeout=None)


def math_verify_score(completion: str, answer: str) -> float:
  """1.0 when Math-Verify finds the completion's final answer equal to the reference ``answer``,
    else 0.0 (no timeout of its own: run it in a `verify_pool.VerifierPool`)."""
  parse, verify = _math_verify()
  predicted = parse(completion, parsing_timeout=None)
  return float(verify(_parse_reference(answer), predicted, timeout_seconds=None))


class MathVerifyReward:
  """``reward_fn(prompts, completions, answers) -> [B] float32`` scored by ``check``
  (`math_verify_score`) in ``workers`` processes; an answer not checked within ``timeout_s``
  scores 0. Starts its workers now; ``close()`` ends them."""

  def __init__(self, *, workers: int, timeout_s: float, check: Callable = math_verify_score):
    require_math_verify()
    self.pool = verify_pool.VerifierPool(check, workers=workers, timeout_s=timeout_s)

  def __call__(self, prompts: Sequence[str], completions: Sequence[str],
               answers: Sequence[str]) -> np.ndarray:
    if len(prompts) != len(completions):
      raise ValueError(f'prompts, completions and answers must have equal length, got '
                       f'{len(prompts)}, {len(completions)}, {len(answers)}')
    return self.pool.score(completions, answers)

  @staticmethod
  def require() -> None:
    """What the config check calls before any compute."""
    require_math_verify()

  def close(self) -> None:
    self.pool.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
