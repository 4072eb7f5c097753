"""What every importer turns a dump into: one `Rollout` per completion, then the arrays of a ledger.

A reader (`jtc.interop.prime_rl`, `slime`, `verl`, `neutral`) yields `Rollout` records, each
naming where it came from (``where``: file and line or sample) so that a bad value is one line
naming the file, the row and the field (`DumpError`). `arrange` puts them in groups of G
contiguous rows, as a jtc ledger holds them (a group smaller than the largest is padded with
empty rows, listed in ``padded_rows``), and `arrays` lays them out as the ledger's columns: the
prompt left-padded to width P, the completion right-padded to T. A value the dump does not hold
is NaN (log-probs, rewards), never a guess.

Dimension key (docs/dimensions.md): B rows (groups of G contiguous), G group size, P prompt width,
T completion length.
"""

import dataclasses
import math
from typing import Any

import numpy as np


class DumpError(ValueError):
  """A dump that jtc cannot read as its framework writes it: ``where`` (file, row), the field and
  what is wrong, in one line."""

  def __init__(self, where, field, problem):
    super().__init__(f'{where}: field {field!r}: {problem}' if field else f'{where}: {problem}')


@dataclasses.dataclass
class Rollout:
  """One completion of a dump. Per-token lists align with ``completion_ids``; None: the dump
  does not hold it.

  Attributes:
    where: file and row, for error messages.
    step: the training step the dump belongs to.
    group: a hashable key shared by the completions of one prompt.
    prompt_ids, completion_ids: token ids.
    mask: 1 where the token carries gradient (the dump's loss mask).
    advantage, reward: per completion.
    logps: the trainer's log pi at the dump's point; old_logps: the behaviour policy's (the
      ratio's denominator); sampler_logps: the inference engine's; ref_logps: a reference's.
    framework: {name: per-token list} the framework's own per-token streams (e.g. prime-rl's
      'coef', 'rl_weights'), kept beside jtc's coefficient.
    truncated: the completion hit the length limit.
    prompt_text, completion_text: text when the dump has it.
  """
  where: str
  step: int
  group: Any
  prompt_ids: list
  completion_ids: list
  mask: list
  advantage: float | None = None
  reward: float | None = None
  logps: list | None = None
  old_logps: list | None = None
  sampler_logps: list | None = None
  ref_logps: list | None = None
  framework: dict = dataclasses.field(default_factory=dict)
  truncated: bool = False
  prompt_text: str | None = None
  completion_text: str | None = None


def require(record, field, where):
  """``record[field]``; DumpError naming the field when it is missing."""
  if not isinstance(record, dict):
    raise DumpError(where, None, f'expected an object, found a {type(record).__name__}')
  if field not in record or record[field] is None:
    raise DumpError(where, field, f'missing (the record has {sorted(record)[:12]})')
  return record[field]


def ids(values, field, where, n=None):
  """A list of token ids (ints), of length ``n`` when given."""
  if not isinstance(values, (list, tuple)):
    raise DumpError(where, field, f'expected a list of token ids, found {type(values).__name__}')
  if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
    bad = next(v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0)
    raise DumpError(where, field, f'{bad!r} is not a token id')
  _length(values, field, where, n)
  return [int(v) for v in values]


def floats(values, field, where, n):
  """A per-token list of floats of length ``n`` (None / null, as a writer writes a non-finite
  value, becomes NaN); DumpError naming the field when the length differs (ragged)."""
  if not isinstance(values, (list, tuple)):
    raise DumpError(where, field, f'expected a per-token list, found {type(values).__name__}')
  _length(values, field, where, n)
  out = []
  for v in values:
    if v is None:
      out.append(math.nan)
    elif isinstance(v, bool) or isinstance(v, (int, float)):
      out.append(float(v))
    else:
      raise DumpError(where, field, f'{v!r} is not a number')
  return out


def number(value, field, where):
  """One finite number (a reward, an advantage)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise DumpError(where, field, f'{value!r} is not a finite number')
  return float(value)


def _length(values, field, where, n):
  if n is not None and len(values) != n:
    raise DumpError(where, field, f'ragged: {len(values)} values for {n} tokens')


def arrange(rollouts):
  """(rows, G): the rollouts ordered group by group (groups in order of first appearance), each
  group padded with None rows up to the largest group's size G."""
  if not rollouts:
    raise ValueError('the dump holds no completion')
  groups = {}
  for r in rollouts:
    groups.setdefault(r.group, []).append(r)
  G = max(len(g) for g in groups.values())
  rows = []
  for members in groups.values():
    rows += members + [None] * (G - len(members))
  return rows, G


def group_advantages(rewards, estimator, *, eps=1e-6):
  """Advantages of one group's rewards as verl and slime compute them from the score: 'grpo'
  (r - mean) / (std + eps) with the sample std (torch.std, ddof 1), 'dr_grpo' r - mean, 'rloo'
  r - mean of the others. A group of one, or of equal rewards, gets 0 (jtc's convention; verl
  gives a lone completion r / (1 + eps))."""
  r = np.asarray(rewards, np.float64)
  if len(r) < 2 or np.all(r == r[0]):
    return np.zeros_like(r)
  if estimator == 'grpo':
    return (r - r.mean()) / (r.std(ddof=1) + eps)
  if estimator == 'dr_grpo':
    return r - r.mean()
  if estimator == 'rloo':
    return r - (r.sum() - r) / (len(r) - 1)
  raise ValueError(f'--advantage {estimator!r} is not valid; valid: grpo, dr_grpo, rloo')


ADVANTAGES = ('grpo', 'dr_grpo', 'rloo')


def fill_advantages(rollouts, estimator):
  """Sets each rollout's advantage from the rewards of its group when the dump has none (verl and
  slime dump the score, not the advantage); DumpError for a rollout with neither."""
  groups = {}
  for r in rollouts:
    groups.setdefault(r.group, []).append(r)
  for members in groups.values():
    if all(m.advantage is not None for m in members):
      continue
    missing = next((m for m in members if m.reward is None), None)
    if missing is not None:
      raise DumpError(missing.where, 'reward', 'missing: the row has no advantage and no reward')
    for m, a in zip(members, group_advantages([m.reward for m in members], estimator)):
      m.advantage = float(a)


def _per_token(rows, T, get, fill=0.0, dtype=np.float32):
  out = np.full((len(rows), T), fill, dtype)
  for b, r in enumerate(rows):
    values = None if r is None else get(r)
    if values is not None:
      out[b, :len(values)] = values
  return out


def _all_have(rows, get):
  real = [r for r in rows if r is not None]
  return all(get(r) is not None for r in real)


def arrays(rows):
  """The ledger's input columns of ``rows`` (from `arrange`): prompt_BP / prompt_mask_BP (left
  padded), completion_BT / completion_mask_BT / mask_BT (right padded), truncated_B, rewards_B
  (NaN: not in the dump), advantages_B, and the log-prob columns old_logps_BT, logps_BT,
  sampler_logps_BT, ref_logps_BT, each NaN on the real tokens of a row whose dump lacks it (ref
  only when every row has it; padding 0), and framework_<name>_BT for every framework stream."""
  real = [r for r in rows if r is not None]
  P = max(len(r.prompt_ids) for r in real)
  T = max(max(len(r.completion_ids) for r in real), 1)
  B = len(rows)
  prompt_BP = np.zeros((B, P), np.int32)
  prompt_mask_BP = np.zeros((B, P), np.int32)
  for b, r in enumerate(rows):
    if r is not None and r.prompt_ids:
      prompt_BP[b, P - len(r.prompt_ids):] = r.prompt_ids
      prompt_mask_BP[b, P - len(r.prompt_ids):] = 1
  cols = {
      'prompt_BP':
          prompt_BP,
      'prompt_mask_BP':
          prompt_mask_BP,
      'completion_BT':
          _per_token(rows, T, lambda r: r.completion_ids, 0, np.int32),
      'completion_mask_BT':
          _per_token(rows, T, lambda r: [1] * len(r.completion_ids), 0, np.int32),
      'mask_BT':
          _per_token(rows, T, lambda r: r.mask),
      'truncated_B':
          np.array([r is not None and r.truncated for r in rows]),
      'rewards_B':
          np.array([math.nan if r is None or r.reward is None else r.reward for r in rows],
                   np.float32),
      'advantages_B':
          np.array([0.0 if r is None else r.advantage for r in rows], np.float32),
  }
  for name in ('old_logps', 'logps', 'sampler_logps'):  # NaN on the real tokens of a row without
    cols[f'{name}_BT'] = _per_token(
        rows, T, lambda r, n=name: getattr(r, n) or [math.nan] * len(r.completion_ids))
  if _all_have(rows, lambda r: r.ref_logps):
    cols['ref_logps_BT'] = _per_token(rows, T, lambda r: r.ref_logps, 0.0)
  streams = sorted({k for r in real for k in r.framework})
  for name in streams:
    cols[f'framework_{name}_BT'] = _per_token(rows, T, lambda r, n=name: r.framework.get(n), 0.0)
  return cols
