"""Which verifier a run scores with, from its config's `data` section (`from_config`), checked
before any compute (`check_config`).

- ``data.reward``: a verifier of `jtc.data.rewards` by name (``''``: the task's own; a dataset
  run: ``boxed_numeric``), or a user's function ``MODULE:FUNCTION`` called as
  ``data.reward_signature`` says (`jtc.data.custom_rewards`: verl's ``compute_score``, TRL's
  ``reward_funcs``).
- ``data.reward_by_source``: ``'SOURCE=REWARD;SOURCE=REWARD'``, a verifier per ``data_source``
  (the field of verl rows), as verl's ``default_compute_score`` dispatches on it; a source it does
  not name scores with ``data.reward``.

Every verifier has the interface of `jtc.data.rewards` (``(prompts, completions, answers) ->
[B] float32``); `rewards.close_reward_fn` ends the processes of pooled ones (`BySource` too);
`take_metrics` gives the failures a user's function had since the last call (``reward/failed``;
``{}`` for jtc's own verifiers).

Dimension key (docs/dimensions.md): B answers scored in one call.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jtc.data import custom_rewards
from jtc.data import rewards as rewards_lib


def parse_by_source(text: str) -> dict[str, str]:
  """``'a=x;b=y'`` -> ``{'a': 'x', 'b': 'y'}``; ValueError naming ``data.reward_by_source`` for
  an entry without ``=`` or a source named twice."""
  out = {}
  for part in (p.strip() for p in text.split(';')):
    if not part:
      continue
    source, sep, reward = (x.strip() for x in part.partition('='))
    if not sep or not source or not reward:
      raise ValueError(f'config.data.reward_by_source={text!r}: {part!r} is not SOURCE=REWARD '
                       "(entries separated by ';', e.g. 'openai/gsm8k=gsm8k_strict')")
    if source in out:
      raise ValueError(f'config.data.reward_by_source={text!r} names {source!r} twice')
    out[source] = reward
  return out


def _make(name: str, data: Any) -> Callable:
  if custom_rewards.is_function_spec(name):
    return custom_rewards.CustomReward(name, signature=data.reward_signature,
                                       workers=data.verify_workers, timeout_s=data.verify_timeout_s)
  return rewards_lib.make_reward_fn(name, workers=data.verify_workers,
                                    timeout_s=data.verify_timeout_s)


class BySource:
  """Scores each answer with the verifier of its ``data_source`` (``answers[i].data_source``,
  `jtc.data.examples.Reference`), the others with ``default``."""

  def __init__(self, default: Callable, by_source: dict[str, Callable]):
    self.default, self.by_source = default, by_source

  def __call__(self, prompts: Sequence[Any], completions: Sequence[str],
               answers: Sequence[Any]) -> np.ndarray:
    sources = [getattr(a, 'data_source', '') for a in answers]
    scores_B = np.zeros(len(answers), np.float32)
    for source in set(sources):
      rows = [i for i, s in enumerate(sources) if s == source]
      fn = self.by_source.get(source, self.default)
      scores_B[rows] = fn([prompts[i] for i in rows], [completions[i] for i in rows],
                          [answers[i] for i in rows])
    return scores_B

  def take_metrics(self) -> dict[str, float]:
    """The failure counts of its user's functions since the last call, summed."""
    out = {}
    for fn in [self.default, *self.by_source.values()]:
      for k, v in take_metrics(fn).items():
        out[k] = out.get(k, 0.0) + v
    return out

  def close(self) -> None:
    """Ends the processes of every pooled verifier it holds. Idempotent."""
    for fn in [self.default, *self.by_source.values()]:
      rewards_lib.close_reward_fn(fn)


def from_config(data: Any, task: Any = None) -> Callable:
  """The verifier of a config's `data` section: `data.reward` (``''``: ``task``'s own, or
  ``boxed_numeric`` for a dataset run), dispatched per ``data_source`` by
  `data.reward_by_source`. Pooled verifiers start their processes now: end them with `close`."""
  name = data.reward or ('' if task is not None else 'boxed_numeric')
  made = []
  try:
    default = _make(name, data) if name else task.reward_fn
    made.append(default)
    by_source = {}
    for source, reward in parse_by_source(data.get('reward_by_source', '')).items():
      by_source[source] = _make(reward, data)
      made.append(by_source[source])
  except BaseException:
    for fn in made:
      rewards_lib.close_reward_fn(fn)
    raise
  return BySource(default, by_source) if by_source else default


def take_metrics(reward_fn: Callable) -> dict[str, float]:
  """``{'reward/failed': n}``: answers a user's function failed on (scored 0) since the last call
  (`custom_rewards.CustomReward`, also inside `BySource`); ``{}`` for jtc's own verifiers."""
  return getattr(reward_fn, 'take_metrics', dict)()


def names(data: Any) -> list[str]:
  """Every verifier a config's `data` section names (`data.reward` and the by-source ones)."""
  return [data.reward] * bool(data.reward) + list(
      parse_by_source(data.get('reward_by_source', '')).values())


def check_config(data: Any) -> None:
  """Before any compute: each named verifier exists (a user's function loads and takes the
  arguments of `data.reward_signature`), its package is installed, and the pool's keys are in
  range."""
  rewards_lib.check_config(data)
  valid = rewards_lib.reward_names()
  if data.reward_signature not in custom_rewards.SIGNATURES:
    raise ValueError(f'config.data.reward_signature={data.reward_signature!r} is not valid; '
                     f'valid: {list(custom_rewards.SIGNATURES)}')
  for name in names(data):
    if custom_rewards.is_function_spec(name):
      custom_rewards.check_signature(custom_rewards.load_function(name), data.reward_signature,
                                     name)
    elif name not in valid:
      raise ValueError(f'config.data.reward={name!r} is not valid; valid: {valid} or a function '
                       'MODULE:FUNCTION (config.data.reward_signature verl | trl | trl_chat)')
    elif name in rewards_lib.POOLED_REWARD_FNS:
      rewards_lib.POOLED_REWARD_FNS[name].require()
