"""Two silent traps of a dataset run, named before any compute (the trainer prints these lines).

- Two answer formats: the dataset's prompts already ask for one (verl's GSM8K: "output the final
  answer after ####"; DAPO-Math: "Answer: $Answer"; a ``\\boxed{}`` instruction) and
  ``data.prompt_suffix`` appends another (the real configs' ``\\boxed{}`` instruction).
- A verifier that does not read the dataset's answers: the configured verifier scores the
  reference solutions of the first rows (their worked solutions, e.g. GSM8K's "... #### 72") as
  wrong, so correct completions in the dataset's own format would score 0 too (the default
  ``boxed_numeric`` on GSM8K).

`warnings(data, reward_fn, examples)` returns the lines (none when neither trap is there).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

# What an answer-format instruction looks like in a prompt or a suffix.
FORMAT_RE = re.compile(r'####|\\boxed|\bAnswer:|final answer', re.IGNORECASE)
# How many first rows' reference solutions the verifier scores.
ROWS = 8


def format_instruction(text: str) -> str | None:
  """The answer-format instruction ``text`` carries (what matched), or None."""
  m = FORMAT_RE.search(str(text))
  return m.group(0) if m else None


def warnings(data: Any, reward_fn: Callable, examples: Sequence[dict]) -> list[str]:
  """The trap lines for a config's `data` section, its verifier and the dataset's first rows."""
  out = []
  rows = list(examples[:ROWS])
  asked = next((format_instruction(e['prompt']) for e in rows if format_instruction(e['prompt'])),
               None)
  added = format_instruction(data.prompt_suffix)
  if asked and added:
    out.append(f'warning: the prompts already ask for an answer format ({asked!r}) and '
               f'config.data.prompt_suffix={data.prompt_suffix!r} asks for another ({added!r}); '
               "for prompts that carry their own instruction set --config.data.prompt_suffix=''")
  worked = [e for e in rows if e.get('solution') and str(e['solution']) != str(e['answer'])]
  if worked and not hasattr(reward_fn, 'take_metrics'):  # a user's function is not probed
    scores = reward_fn([e['prompt'] for e in worked], [str(e['solution']) for e in worked],
                       [e['answer'] for e in worked])
    wrong = [e for e, s in zip(worked, scores) if s <= 0.5]
    if len(wrong) * 2 > len(worked):
      name = data.reward or 'boxed_numeric'
      out.append(f'warning: config.data.reward={name!r} scores {len(wrong)} of the first '
                 f'{len(worked)} reference solutions as wrong (e.g. '
                 f'{str(wrong[0]["solution"])[-60:]!r} against {str(wrong[0]["answer"])!r}): it '
                 'does not read the dataset\'s answer format, so completions in that format score '
                 '0 too; see docs/verifiers.md (gsm8k_strict, numeric_match, math_verify)')
  return out


def for_run(data: Any, reward_fn: Callable) -> list[str]:
  """`warnings` of a dataset run (its train split's first rows); [] for a task."""
  if not data.dataset:
    return []
  from jtc.data import pipeline  # pylint: disable=import-outside-toplevel
  from jtc.data import selection  # pylint: disable=import-outside-toplevel
  examples = pipeline.load_rows(selection.train_rows(data), data_dir=data.data_dir or None,
                                limit=ROWS)
  return warnings(data, reward_fn, examples)
