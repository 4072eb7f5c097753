"""Prompts longer than ``data.prompt_width`` tokens (``data.overlong``), settled before a run.

  error     a prompt that does not fit is an error naming it and the width it needs (the
            default; the run checks its held-out prompts and its first 2,000 training ones);
  drop      every prompt is measured before the run; those that do not fit are left out of
            training and evaluation, and how many is printed (verl's
            ``data.filter_overlong_prompts=True``);
  truncate  every prompt is measured before the run; one that does not fit loses tokens on the
            LEFT, right after BOS: the start of the prompt (a system message, earlier few-shot
            turns), never its question. A prompt whose cut would reach its last user turn (the
            question, the suffix, the chat template's tokens of that turn) is refused before the
            run, naming it: a prompt of one message has nothing else, so it is never cut. How many
            are cut is printed. (verl's ``data.truncation='left'`` cuts without that check.)

The pure parts are here; `jtc.data.pipeline` measures prompts with the tokenizer
(`pipeline.fitted_ids`) and `pipeline.run_data` applies the mode to a run's rows.
"""
from __future__ import annotations

from typing import Sequence

MODES = ('error', 'drop', 'truncate')


def check(mode: str) -> None:
  """ValueError naming ``config.data.overlong`` and the valid modes."""
  if mode not in MODES:
    raise ValueError(f'config.data.overlong={mode!r} is not valid; valid: {list(MODES)}')


def last_turn_start(text: str, prompt) -> int:
  """The offset in ``text`` (``prompt`` rendered, with or without the chat template) where its last
  user turn begins: right after the content of the message before it. 0 for a prompt of one
  message (all of it is the question), and when the messages cannot be found in ``text``."""
  messages = getattr(prompt, 'messages', None)
  if not messages or len(messages) < 2:
    return 0
  question = text.rfind(messages[-1]['content'])
  previous = messages[-2]['content']
  end = text.rfind(previous, 0, max(question, 0))
  return 0 if question < 0 or end < 0 else end + len(previous)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  """The length of the longest common prefix of two token lists."""
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


def cut_left(ids: Sequence[int], *, width: int, head: int, cuttable: int) -> list[int]:
  """``ids`` cut to ``width`` tokens on the left: ``ids[:head] + ids[head + cut:]`` (``head``: a
  BOS kept), ``cut = len(ids) - width``; ValueError when ``cut`` exceeds the ``cuttable`` tokens
  that follow the head (those before the last user turn)."""
  cut = len(ids) - width
  if cut <= 0:
    return list(ids)
  if cut > cuttable or width <= head:
    raise ValueError(f'it takes {len(ids)} tokens and cutting the {cut} over '
                     f'config.data.prompt_width={width} on the left would cut into its question '
                     f'(only {cuttable} tokens precede its last user turn); set '
                     'config.data.overlong=drop or a larger config.data.prompt_width')
  return list(ids[:head]) + list(ids[head + cut:])


def note(mode: str, *, over: int, total: int, what: str, width: int) -> str:
  """The line printed before a run: how many of ``total`` prompts were dropped or truncated."""
  done = {'drop': 'dropped', 'truncate': 'truncated on the left'}[mode]
  return (f'config.data.overlong={mode!r}: {done} {over} of {total} {what} prompts longer than '
          f'config.data.prompt_width={width} tokens')
