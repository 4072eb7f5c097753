"""A dataset as a config's run would see it (`jtc data PATH --config CONFIG`): for the first rows,
the prompt exactly as the model reads it (suffix and chat template applied), its token count
against ``data.prompt_width`` (and what ``data.overlong`` does with one that does not fit), and
the configured verifier's score of the row's reference solution; then the traps of
`jtc.data.traps`. Both traps of verl's GSM8K with a real config (two answer formats, a verifier
that cannot read '#### x') show before a run.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from jtc.data import pipeline
from jtc.data import traps


def overlong_fate(prompt, *, tokenizer: Any, data: Any) -> str:
  """What ``data.overlong`` does with a prompt longer than ``data.prompt_width``, in words."""
  if data.overlong == 'drop':
    return 'DOES NOT FIT: dropped (config.data.overlong=drop)'
  if data.overlong == 'truncate':
    try:
      pipeline.fitted_ids(tokenizer, prompt, width=data.prompt_width,
                          chat_template=data.chat_template)
    except ValueError as e:
      return f'DOES NOT FIT, and cannot be truncated: {e}'
    return 'DOES NOT FIT: truncated on the left (config.data.overlong=truncate)'
  return 'DOES NOT FIT'


def row_lines(i: int, example: dict, *, tokenizer: Any, data: Any, reward_fn: Callable) -> list:
  """The lines of row ``i``: the rendered prompt, its tokens against the width, the score."""
  prompt = example['prompt'] + data.prompt_suffix
  text = tokenizer.apply_chat_template(getattr(prompt, 'messages',
                                               prompt)) if data.chat_template else str(prompt)
  n = len(pipeline.prompt_ids(tokenizer, prompt, chat_template=data.chat_template))
  fits = 'fits' if n <= data.prompt_width else overlong_fate(prompt, tokenizer=tokenizer, data=data)
  solution = str(example.get('solution') or example['answer'])
  score = float(reward_fn([example['prompt']], [solution], [example['answer']])[0])
  return [
      f'[{i}] prompt as the model reads it ({n} tokens; config.data.prompt_width='
      f'{data.prompt_width}: {fits}):', *('    ' + line for line in text.split('\n')),
      f'    reference answer {str(example["answer"])!r}; the verifier scores the reference '
      f'solution {solution[-60:]!r}: {score:g}'
  ]


def preview(data: Any, examples: Sequence[dict], *, tokenizer: Any,
            reward_fn: Callable) -> list[str]:
  """Every row's `row_lines`, then the trap warnings (`traps.warnings`)."""
  lines = []
  for i, example in enumerate(examples):
    lines += row_lines(i, example, tokenizer=tokenizer, data=data, reward_fn=reward_fn)
  return lines + traps.warnings(data, reward_fn, examples)
