"""Verifiers for sequence-level rewards: answer extraction, numeric equivalence, a safe parser.

Every reward function has one interface::

    reward_fn(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str])
        -> np.ndarray  # [B] float32

so the trainer never needs to know which verifier it runs (``make_reward_fn(name, ...)``).
Most are plain functions (``REWARD_FNS``); ``math_verify`` (Hugging Face's Math-Verify, an
optional package) runs in worker processes with a per-answer timeout
(``POOLED_REWARD_FNS``, `jtc.data.math_verifier`): a run starts it once and closes it at its end.

Nothing here calls ``eval``/``exec`` on model output: arithmetic expressions go through a small
tokenizer + recursive-descent parser (``jtc.data.expressions``) with limits on length, nesting
depth, exponent size and the bit size of intermediate values, so no input can hang it.

Answer extraction rule (``extract_answer``), first rule that fires wins:
  1. ``\\boxed{...}`` (or ``\\fbox{...}``): the content of the LAST one whose braces balance
     (nested braces allowed, e.g. ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``).
  2. ``answer is`` / ``answer:`` (case-insensitive, last occurrence): the number right after it,
     or else the rest of that line up to the first sentence end, trailing period removed.
  3. GSM8K ``#### X`` (last occurrence): ``X``.
  4. Fallback: the LAST number in the text (``-12``, ``3.5``, ``3/4``, ``3 / 4``, ``1,234``); a
     ``-`` is a sign only when it does not follow a digit, letter or ``)`` (so ``10-3`` ends in
     ``3``).
  5. Otherwise ``None`` (reward 0).

Before extraction and parsing, Unicode minus signs and dashes (U+2212, U+2012-U+2015, U+FE63,
U+FF0D) become ``-``, so "the result is \\u22125" (a real minus sign) is -5, never 5.

Numbers are compared as exact ``fractions.Fraction`` values, so ``"0.5" == "1/2" == "\\frac{1}{2}"
== "\\dfrac12" == "2/4" == "3 / 6"`` and ``"1,000" == "1000" == "1000.0"``. ``parse_number`` also
drops what math verifiers treat as decoration of a number (``answer_number_text``):
  * a single-variable left-hand side: ``x = 5``, ``n_1 = 5`` -> 5 (``x = 6`` is 6, not 5);
  * units written as text after the number: ``5 \\text{ apples}``, ``5\\mbox{cm}`` -> 5
    (bare words are not units: ``5 apples`` and ``5x`` parse to nothing);
  * currency and degrees: ``\\$5``, ``$5``, ``30^\\circ`` -> 5, 30;
  * a percent sign is a unit label, not a factor 1/100: ``5\\%`` == ``5\\,\\%`` == ``5%`` == 5,
    and ``5\\%`` != 0.05. References of math datasets (MATH, GSM8K) write "what percent"
    answers as the bare number, so this is the reading that agrees with them.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

from jtc import checks
from jtc.data import expressions
from jtc.data import math_verifier
from jtc.data import verl_rules

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], np.ndarray]

# Bounds that keep every verifier fast on any input.
MAX_NUMBER_CHARS = 64  # a numeric answer longer than this is not parsed as a number
_MAX_BOXED_TRIES = 8  # how many trailing \boxed{ occurrences are tried for balanced braces

# ----------------------------------------------------------------------------- numbers

_DEC_RE = re.compile(r'[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?\.\d+|[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)\.?')
_FRAC_RE = re.compile(r'([+-]?\d+)\s*/\s*([+-]?\d+)')
_TEX_FRAC_RE = re.compile(r'([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{([+-]?\d+)\}')

_DASHES = '\u2212\u2012\u2013\u2014\u2015\ufe63\uff0d'
_DASH_TABLE = str.maketrans({c: '-' for c in _DASHES})


def normalize_dashes(text: str) -> str:
  """Replaces Unicode minus signs and dashes (U+2212, U+2012-U+2015, U+FE63, U+FF0D) by ``-``."""
  return text.translate(_DASH_TABLE)


def _strip_answer_text(text: str) -> str:
  """Removes wrappers that never change a value: $, \\text{}, \\!, spaces, trailing period;
    Unicode minus signs become ``-``."""
  s = normalize_dashes(text).strip()
  s = s.replace('\\!', '').replace('\\,', '').replace('\\ ', '')
  s = re.sub(r'\\(?:text|mathrm|textbf|mathbf)\{([^{}]*)\}', r'\1', s)
  s = s.replace('\\left', '').replace('\\right', '')
  s = s.strip().rstrip('.').strip().strip('$').strip().rstrip('.').strip()
  return s.replace(' ', '')


# A unit after a number: \text{ apples}, \mbox{cm}, \mathrm{kg} (letters, spaces, dots only).
_UNIT_TEXT_RE = re.compile(r'\s*\\(?:text|textrm|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}\s*$')
_DEGREE_RE = re.compile(r'\^\s*(?:\\circ|\{\s*\\circ\s*\})\s*$')
_PERCENT_RE = re.compile(r'(?:\\,|\\!|\\ |\s)*\\?%\s*$')
_VARIABLE_LHS_RE = re.compile(r'[A-Za-z](?:_\{?[A-Za-z0-9]{1,4}\}?)?=')
_FRAC_SHORTHAND_RE = re.compile(r'(\\[dt]?frac)\s*(\d)')  # \frac34 -> \frac{3}4
_FRAC_SHORTHAND_DEN_RE = re.compile(r'(\\[dt]?frac\{[^{}]*\})\s*(\d)')  # \frac{3}4 -> \frac{3}{4}


def answer_number_text(text: str) -> str:
  """The number part of an answer: variable ``x =``, text units, ``\\$``, degrees and percent
    signs removed and ``\\frac34`` written ``\\frac{3}{4}`` (see the module docstring); then
    ``_strip_answer_text``. Text without those decorations is only stripped."""
  s = normalize_dashes(text).strip().rstrip('.').strip().strip('$').strip()
  for _ in range(2):  # "5\,\% \text{ off}" has two trailing decorations
    s = _UNIT_TEXT_RE.sub('', s)
    s = _DEGREE_RE.sub('', s)
    s = _PERCENT_RE.sub('', s)
  s = s.replace('\\$', '')
  s = _FRAC_SHORTHAND_RE.sub(r'\1{\2}', s)
  s = _FRAC_SHORTHAND_DEN_RE.sub(r'\1{\2}', s)
  s = _strip_answer_text(s)
  lhs = _VARIABLE_LHS_RE.match(s)
  if lhs is not None:
    s = s[lhs.end():]
  return s


def parse_number(text: str | None) -> Fraction | None:
  """Parses an integer, decimal or fraction answer into an exact ``Fraction``.

    Accepts ``42``, ``-42`` (also with a Unicode minus), ``+42``, ``1,234`` (thousands commas),
    ``3.50``, ``.5``, ``3/4``, ``3 / 4``, ``\\frac{3}{4}`` (also ``\\dfrac``/``\\tfrac`` and the
    ``\\frac34`` shorthand), each optionally wrapped in ``$...$``, followed by a sentence-final
    period, or decorated as in ``answer_number_text`` (``x = 5``, ``5 \\text{ apples}``,
    ``\\$5``, ``5\\%``, ``30^\\circ``). Returns ``None`` for anything else (including strings
    longer than ``MAX_NUMBER_CHARS`` and zero denominators). Never raises.
    """
  if text is None or not isinstance(text, str):
    return None
  if len(text) > 4 * MAX_NUMBER_CHARS:
    return None
  s = answer_number_text(text)
  if not s or len(s) > MAX_NUMBER_CHARS:
    return None
  m = _TEX_FRAC_RE.fullmatch(s)
  if m:
    num, den = int(m.group(2)), int(m.group(3))
    if den == 0:
      return None
    value = Fraction(num, den)
    return -value if m.group(1) == '-' else value
  m = _FRAC_RE.fullmatch(s)
  if m:
    num, den = int(m.group(1)), int(m.group(2))
    return None if den == 0 else Fraction(num, den)
  if _DEC_RE.fullmatch(s):
    s = s.replace(',', '')
    if s.endswith('.'):
      s = s[:-1]
    if s in ('', '+', '-'):
      return None
    return Fraction(s)
  return None


def numbers_equal(a: str | None, b: str | None) -> bool:
  """True when both strings parse (``parse_number``) to the same exact value."""
  x, y = parse_number(a), parse_number(b)
  return x is not None and y is not None and x == y


def normalize_answer(text: str | None) -> str:
  """Canonical string for exact matching: wrappers stripped, spaces removed, case kept."""
  return '' if text is None else _strip_answer_text(text)


# ----------------------------------------------------------------------------- extraction

_NUMBER_IN_TEXT_RE = re.compile(
    r'(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[ \t]{0,3}/[ \t]{0,3}\d+)?')
_ANSWER_IS_RE = re.compile(r'answer\s*(?:is|:)\s*:?', re.IGNORECASE)
_GSM8K_RE = re.compile(r'####\s*([^\n]*)')
_BOXED_RE = re.compile(r'\\(?:boxed|fbox)\s*\{')


def extract_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` whose braces balance (nesting allowed), else None."""
  starts = [m.end() for m in _BOXED_RE.finditer(text)]
  for start in reversed(starts[-_MAX_BOXED_TRIES:]):
    depth = 1
    for i in range(start, len(text)):
      c = text[i]
      if c == '{':
        depth += 1
      elif c == '}':
        depth -= 1
        if depth == 0:
          return text[start:i].strip()
  return None


def last_number(text: str) -> str | None:
  """The last number in ``text`` (see the module docstring for what counts), else None."""
  found = None
  for found in _NUMBER_IN_TEXT_RE.finditer(text):
    pass
  return None if found is None else found.group(0)


def extract_answer(text: str | None) -> str | None:
  """Extracts the final answer of a completion by the rule in the module docstring."""
  if not isinstance(text, str) or not text:
    return None
  text = normalize_dashes(text)
  boxed = extract_boxed(text)
  if boxed is not None:
    return boxed
  marker = None
  for marker in _ANSWER_IS_RE.finditer(text):
    pass
  if marker is not None:
    rest = text[marker.end():].split('\n', 1)[0].strip()
    rest = rest.strip('$ ')
    m = _NUMBER_IN_TEXT_RE.match(rest.replace('$', ''))
    if m:
      return m.group(0)
    sentence = re.split(r'\.(?:\s|$)', rest, maxsplit=1)[0].strip()
    if sentence:
      return sentence
  gsm = None
  for gsm in _GSM8K_RE.finditer(text):
    pass
  if gsm is not None and gsm.group(1).strip():
    return gsm.group(1).strip()
  return last_number(text)


def has_explicit_answer(text: str | None) -> bool:
  """True when the answer is marked (``\\boxed{}``, ``answer is``, ``####``), not only guessed."""
  if not isinstance(text, str):
    return False
  return (extract_boxed(text) is not None or _ANSWER_IS_RE.search(text) is not None or
          _GSM8K_RE.search(text) is not None)


# ----------------------------------------------------------------------------- reward fns


def _check_batch(prompts, completions, answers) -> None:
  if not (len(prompts) == len(completions) == len(answers)):
    raise ValueError(f'prompts, completions and answers must have equal length, got '
                     f'{len(prompts)}, {len(completions)}, {len(answers)}')


def _per_example(score: Callable[[str, str, str], float]) -> RewardFn:

  def reward_fn(prompts, completions, answers) -> np.ndarray:
    _check_batch(prompts, completions, answers)
    out = [score(p, c, a) for p, c, a in zip(prompts, completions, answers)]
    return np.asarray(out, dtype=np.float32).reshape(len(out))

  reward_fn.__doc__ = score.__doc__
  reward_fn.__name__ = score.__name__
  return reward_fn


def _exact_match(prompt: str, completion: str, answer: str) -> float:
  """1.0 when the extracted answer equals the reference as a normalized string."""
  del prompt
  extracted = extract_answer(completion)
  return float(extracted is not None and normalize_answer(extracted) == normalize_answer(answer))


def _numeric_match(prompt: str, completion: str, answer: str) -> float:
  """1.0 when the extracted answer equals the reference as an exact number
    (integer/decimal/fraction equivalence); non-numeric references fall back to exact match."""
  extracted = extract_answer(completion)
  if extracted is None:
    return 0.0
  if parse_number(answer) is not None:
    return float(numbers_equal(extracted, answer))
  return _exact_match(prompt, completion, answer)


def _boxed_numeric(prompt: str, completion: str, answer: str) -> float:
  """1.0 iff the completion's last balanced ``\\boxed{...}`` equals the reference: as numbers
    when the reference is one (``\\boxed{0.5}`` == ``1/2``), else as normalised strings. No
    ``\\boxed{}`` scores 0 (the strict verifier of the papers' math runs, unlike
    `numeric_match`, which also accepts "the answer is 42")."""
  del prompt
  boxed = extract_boxed(completion or '')
  if boxed is None:
    return 0.0
  if parse_number(answer) is not None:
    return float(numbers_equal(boxed, answer))
  return float(normalize_answer(boxed) == normalize_answer(answer))


def _format(prompt: str, completion: str, answer: str) -> float:
  """1.0 when the completion marks its answer explicitly (``\\boxed{}``, ``answer is``, ``####``)."""
  del prompt, answer
  return float(has_explicit_answer(completion))


def _expression_match(prompt: str, completion: str, answer: str) -> float:
  """1.0 when the completion (left of its first '=') is a valid expression equal to the answer."""
  del prompt
  target = parse_number(answer)
  if target is None or not isinstance(completion, str):
    return 0.0
  lhs = normalize_dashes(completion).strip().split('\n', 1)[0].split('=', 1)[0].strip().rstrip('.')
  try:
    return float(expressions.evaluate_expression(lhs) == target)
  except expressions.ExpressionError:
    return 0.0


exact_match = _per_example(_exact_match)
numeric_match = _per_example(_numeric_match)
boxed_numeric = _per_example(_boxed_numeric)
format_reward = _per_example(_format)
expression_match = _per_example(_expression_match)

REWARD_FNS: dict[str, RewardFn] = {
    'exact_match': exact_match,
    'numeric_match': numeric_match,
    'boxed_numeric': boxed_numeric,
    'format': format_reward,
    'expression_match': expression_match,
    'gsm8k_strict': verl_rules.gsm8k_strict,  # verl's strict GSM8K rule (jtc.data.verl_rules)
}

# Verifiers that run in worker processes (jtc.data.verify_pool), started once per run and closed
# at its end: name -> factory(workers=, timeout_s=) of a reward fn with a close() method and a
# static require() that raises ValueError when its package is missing.
POOLED_REWARD_FNS = {'math_verify': math_verifier.MathVerifyReward}


def reward_names() -> list[str]:
  """Every valid ``config.data.reward`` name but '' (the task's own)."""
  return sorted({**REWARD_FNS, **POOLED_REWARD_FNS})


def get_reward_fn(name: str) -> RewardFn:
  """Looks up a reward function ``(prompts, completions, answers) -> [B] float32`` by name
    (the plain ones; `make_reward_fn` also starts the pooled ones)."""
  if name not in REWARD_FNS:
    raise ValueError(f'unknown reward function {name!r}; valid: {sorted(REWARD_FNS)}')
  return REWARD_FNS[name]


def make_reward_fn(name: str, *, workers: int, timeout_s: float) -> RewardFn:
  """The reward function ``name``; a pooled one (``POOLED_REWARD_FNS``) starts ``workers``
    processes with ``timeout_s`` per answer now: end it with `close_reward_fn`."""
  if name in POOLED_REWARD_FNS:
    return POOLED_REWARD_FNS[name](workers=workers, timeout_s=timeout_s)
  if name not in REWARD_FNS:
    raise ValueError(f'unknown reward function {name!r}; valid: {reward_names()}')
  return REWARD_FNS[name]


def close_reward_fn(reward_fn: RewardFn) -> None:
  """Ends a pooled reward function's processes (nothing for a plain function). Idempotent."""
  close = getattr(reward_fn, 'close', None)
  if close is not None:
    close()


def check_config(data) -> None:
  """A config's verifier pool keys, before any compute (`pipeline.check_config` checks the
    name): ``data.verify_workers`` and ``data.verify_timeout_s`` in range, and the package of a
    pooled ``data.reward`` installed."""
  checks.positive_int('config.data.verify_workers', data.verify_workers)
  checks.positive('config.data.verify_timeout_s', data.verify_timeout_s)
  if data.reward in POOLED_REWARD_FNS:
    POOLED_REWARD_FNS[data.reward].require()


def combine(*weighted: tuple[float, RewardFn]) -> RewardFn:
  """Weighted sum of reward functions, e.g. ``combine((1.0, numeric_match), (0.1, format_reward))``."""
  if not weighted:
    raise ValueError('combine needs at least one (weight, reward_fn) pair')

  def reward_fn(prompts, completions, answers) -> np.ndarray:
    total = np.zeros(len(completions), dtype=np.float32)
    for weight, fn in weighted:
      total += np.float32(weight) * fn(prompts, completions, answers)
    return total

  return reward_fn
