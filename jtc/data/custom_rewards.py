"""Reward functions from verl and TRL, unchanged: ``--config.data.reward=MODULE:FUNCTION``.

``MODULE`` is an importable module (``my_rewards``, ``pkg.rewards``) or a Python file
(``path/to/rewards.py``); ``data.reward_signature`` says how the function is called:

- ``verl`` (verl's ``custom_reward_function``): one call per completion,
  ``compute_score(data_source=..., solution_str=completion, ground_truth=..., extra_info=...)``
  returning a number or a dict with ``'score'`` (its other keys are not read). ``ground_truth``
  is the row's ``reward_model.ground_truth`` as stored (a verl row), else jtc's reference answer;
  ``extra_info`` the row's ``extra_info`` ({} without one); ``data_source`` the row's (''
  without one).
- ``trl`` (TRL's ``reward_funcs``, standard format): ``fn(prompts=[prompt], completions=[text],
  **columns)`` returning a list of one number, where ``columns`` are the row's other fields, each
  as a list of one (TRL passes every dataset column but the prompt this way). ``trl_chat`` is
  TRL's conversational format: the prompt as its chat messages and the completion as
  ``[{'role': 'assistant', 'content': text}]``.

A TRL function is called with one completion at a time so that the pool's per-answer timeout and
failure accounting apply to each answer. The function runs in the verifier pool
(`jtc.data.verify_pool`: ``data.verify_workers`` processes, ``data.verify_timeout_s`` per
answer). A call that raises, returns no finite number or times out scores 0, never stops the run:
`CustomReward` counts them (``reward/failed`` in metrics.jsonl, per step) and prints one line per
kind of failure when first seen and a total when the run ends.

Dimension key (docs/dimensions.md): B answers scored in one call.
"""
from __future__ import annotations

import collections
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Sequence

import numpy as np

from jtc.data import verify_pool

SIGNATURES = ('verl', 'trl', 'trl_chat')


def is_function_spec(name: str) -> bool:
  """Whether a ``data.reward`` value names a user's function (``MODULE:FUNCTION``)."""
  return ':' in name


def load_function(spec: str) -> Callable:
  """The function ``spec`` names (``MODULE:FUNCTION`` or ``path/file.py:FUNCTION``); ValueError
  naming the spec and what is wrong."""
  module_name, _, function = spec.rpartition(':')
  if not module_name or not function:
    raise ValueError(f'config.data.reward={spec!r}: a function is named MODULE:FUNCTION or '
                     'path/to/file.py:FUNCTION')
  try:
    if module_name.endswith('.py') or os.sep in module_name:
      path = os.path.abspath(module_name)
      if not os.path.isfile(path):
        raise ValueError(f'no such file {path!r}')
      module_spec = importlib.util.spec_from_file_location(f'_jtc_reward_{abs(hash(path))}', path)
      module = importlib.util.module_from_spec(module_spec)
      module_spec.loader.exec_module(module)
    else:
      module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'config.data.reward={spec!r}: {module_name} cannot be loaded '
                     f'({type(e).__name__}: {e})') from None
  fn = getattr(module, function, None)
  if not callable(fn):
    names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith('_'))
    raise ValueError(f'config.data.reward={spec!r}: {module_name} has no function {function!r}; '
                     f'its functions: {names}')
  return fn


def check_signature(fn: Callable, signature: str, spec: str) -> None:
  """ValueError when ``fn`` cannot take the arguments ``signature`` calls it with (before any
  compute), naming ``data.reward_signature`` and the valid values."""
  if signature not in SIGNATURES:
    raise ValueError(f'config.data.reward_signature={signature!r} is not valid; valid: '
                     f'{list(SIGNATURES)}')
  try:
    params = inspect.signature(fn)
  except (TypeError, ValueError):  # a builtin: nothing to check
    return
  try:
    if signature == 'verl':
      params.bind(data_source='', solution_str='', ground_truth='', extra_info={})
    else:
      params.bind_partial(prompts=[], completions=[])  # columns come as named kwargs
  except TypeError as e:
    raise ValueError(
        f'config.data.reward={spec!r} cannot be called as config.data.reward_signature='
        f'{signature!r} ({e}): verl calls compute_score(data_source, solution_str, ground_truth, '
        f'extra_info), trl / trl_chat fn(prompts, completions, **kwargs)') from None


# ------------------------------------------------------------- what a worker calls (setup)


def _verl_call(fn):

  def score(prompt, completion, ground_truth, data_source, extra_info, columns):
    del prompt, columns
    value = fn(data_source=data_source, solution_str=completion, ground_truth=ground_truth,
               extra_info=extra_info)
    if isinstance(value, dict):
      if 'score' not in value:
        raise TypeError(f'returned a dict without "score" (keys {sorted(value)})')
      value = value['score']
    return value

  return score


def _trl_call(fn, chat):

  def score(prompt, completion, ground_truth, data_source, extra_info, columns):
    del ground_truth, data_source, extra_info
    if chat:
      messages = prompt if isinstance(prompt, list) else [{'role': 'user', 'content': prompt}]
      prompt, completion = messages, [{'role': 'assistant', 'content': completion}]
    elif isinstance(prompt, list):
      prompt = '\n\n'.join(m['content'] for m in prompt)
    values = fn(prompts=[prompt], completions=[completion], **{k: [v] for k, v in columns.items()})
    if not isinstance(values, (list, tuple, np.ndarray)) or len(values) != 1:
      raise TypeError(f'returned {type(values).__name__} {values!r:.60}, not a list of one number '
                      'per completion')
    return values[0]

  return score


def worker_check(spec: str, signature: str) -> Callable:
  """In a pool worker (`verify_pool.VerifierPool` setup): the user's function ``spec`` wrapped to
  score one item ``(prompt, completion, ground_truth, data_source, extra_info, columns)``."""
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())  # a module beside the user's files, as for the trainer
  fn = load_function(spec)
  return _verl_call(fn) if signature == 'verl' else _trl_call(fn, signature == 'trl_chat')


def item(prompt, completion: str, answer) -> list:
  """The JSON arguments of one completion's call: what the row (``answer``: a
  `jtc.data.examples.Reference`, or a plain reference answer) and the prompt hold."""
  row = dict(getattr(answer, 'row', None) or {})
  truth = row.get('reward_model', {}).get('ground_truth') if isinstance(
      row.get('reward_model'), dict) else None
  extra = row.get('extra_info') if isinstance(row.get('extra_info'), dict) else {}
  messages = getattr(prompt, 'messages', None)
  return [
      messages if messages is not None else str(prompt), completion,
      str(answer) if truth is None else truth,
      getattr(answer, 'data_source', '') or '', extra, row
  ]


class CustomReward:
  """``reward_fn(prompts, completions, answers) -> [B] float32`` of a user's function in a
  verifier pool; failures score 0 and are counted (``failed``, by reason in ``reasons``).
  ``take_metrics()`` gives the counts since its last call; ``close()`` ends the workers and
  prints the run's total."""

  def __init__(self, spec: str, *, signature: str, workers: int, timeout_s: float):
    check_signature(load_function(spec), signature, spec)
    if os.getcwd() not in sys.path:
      sys.path.insert(0, os.getcwd())
    self.spec, self.signature = spec, signature
    self.pool = verify_pool.VerifierPool(worker_check, workers=workers, timeout_s=timeout_s,
                                         setup=(spec, signature))
    self.scored = self.failed = self._since = 0
    self.reasons = collections.Counter()

  def __call__(self, prompts: Sequence[Any], completions: Sequence[str],
               answers: Sequence[Any]) -> np.ndarray:
    if not len(prompts) == len(completions) == len(answers):
      raise ValueError(f'prompts, completions and answers must have equal length, got '
                       f'{len(prompts)}, {len(completions)}, {len(answers)}')
    scores_B = self.pool.score_items(
        [item(p, str(c), a) for p, c, a in zip(prompts, completions, answers)])
    for row, why in sorted(self.pool.errors.items()):
      kind = why.split(':', 1)[0]
      if kind not in self.reasons:
        print(
            f'reward: {self.spec} failed on an answer ({why}); it scores 0, and every failure '
            'is counted (reward/failed in metrics.jsonl)', file=sys.stderr)
      self.reasons[kind] += 1
    self.failed += len(self.pool.errors)
    self.scored += len(scores_B)
    return scores_B

  def take_metrics(self) -> dict[str, float]:
    """``{'reward/failed': n}``: answers scored 0 by a failure since the last call."""
    n, self._since = self.failed - self._since, self.failed
    return {'reward/failed': float(n)}

  def close(self) -> None:
    """Ends the workers; prints how many answers failed over the run (when any did)."""
    if not self.pool.closed and self.failed:
      reasons = ', '.join(f'{n} {k}' for k, n in self.reasons.most_common())
      print(
          f'reward: {self.spec} failed on {self.failed} of {self.scored} answers over the run '
          f'(scored 0): {reasons}', file=sys.stderr)
    self.pool.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
