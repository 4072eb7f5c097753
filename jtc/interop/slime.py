"""slime's debug rollout data (``--save-debug-rollout-data``) as `Rollout` records.

slime's rollout manager saves each rollout before training on it (``save_debug_rollout_data`` in
``slime/observability/rollout_data_utils.py``): ``torch.save({'rollout_id': id, 'samples':
[Sample.to_dict() ...]}, path)`` at ``args.save_debug_rollout_data.format(rollout_id=...)``
(default ``<dump_details>/rollout_data/{rollout_id}.pt``; evaluation rollouts as
``eval_<id>``). A sample dict (``slime/utils/types.py``) holds ``group_index, index, prompt,
tokens`` (prompt and response ids), ``response, response_length, reward`` (a number, or a dict
read with ``--reward-key``), ``loss_mask`` (response_length values, or None: all 1),
``rollout_log_probs`` (the inference engine's, one per response token, or None),
``status`` ('completed', 'truncated', 'aborted', ...), ``remove_sample`` and more.

What jtc reads: the prompt is ``tokens[:-response_length]``, the completion the last
``response_length`` tokens; the mask is ``loss_mask`` (all 0 for a removed sample, as slime
trains it); groups are ``group_index``; the advantage is computed from the rewards of the group
as slime's ``_post_process_rewards`` does for grpo / gspo / cispo (``--advantage``: 'grpo'
(r - mean) / (std + 1e-6) with the sample std, 'dr_grpo' without the std); the sampler's
log-probs are ``rollout_log_probs``. The trainer's log-probs are not saved: without
``--policy.checkpoint`` the ledger's one point is the behaviour policy (ratio 1) and every
log-prob but the sampler's is unavailable (NaN).

The file is read with ``torch.load(weights_only=True)`` (plain containers and tensors only): jtc
never unpickles arbitrary objects, so a file holding other objects is refused by name.
"""

import os

from jtc.interop import rollouts as rl


def load(path):
  """The dict slime saved at ``path`` ({'rollout_id', 'samples'})."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'no such file {path!r}')
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError(f'{path}: reading slime\'s torch.save files needs torch '
                     '(pip install torch)') from None
  try:
    data = torch.load(path, weights_only=True, map_location='cpu')
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    raise rl.DumpError(
        path, None, 'not a slime debug rollout file that torch.load(weights_only='
        f'True) reads ({reason})') from None
  if not isinstance(data, dict) or not isinstance(data.get('samples'), list):
    raise rl.DumpError(path, 'samples', 'missing: slime saves {"rollout_id", "samples"}')
  return data


def _as_list(value):
  return value.tolist() if hasattr(value, 'tolist') else value


def _reward(sample, where, reward_key):
  value = sample.get('reward')
  if isinstance(value, dict):
    if not reward_key:
      raise rl.DumpError(where, 'reward', f'a dict {sorted(value)}: pass --reward-key')
    if reward_key not in value:
      raise rl.DumpError(where, f'reward.{reward_key}', f'missing; the reward has {sorted(value)}')
    value = value[reward_key]
  return rl.number(rl.require({'reward': value}, 'reward', where), 'reward', where)


def _sample(sample, where, step, reward_key):
  tokens = rl.ids(_as_list(rl.require(sample, 'tokens', where)), 'tokens', where)
  n = rl.require(sample, 'response_length', where)
  if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < len(tokens):
    raise rl.DumpError(
        where, 'response_length', f'{n!r} for {len(tokens)} tokens (it must leave '
        'a prompt before the response)')
  mask = sample.get('loss_mask')
  mask = [1.0] * n if mask is None else rl.floats(_as_list(mask), 'loss_mask', where, n)
  if sample.get('remove_sample'):
    mask = [0.0] * n
  sampler = sample.get('rollout_log_probs')
  sampler = None if sampler is None else rl.floats(_as_list(sampler), 'rollout_log_probs', where, n)
  group = rl.require(sample, 'group_index', where)
  prompt = sample.get('prompt')
  return rl.Rollout(where=where, step=step, group=group, prompt_ids=tokens[:-n],
                    completion_ids=tokens[-n:], mask=mask,
                    reward=_reward(sample, where, reward_key), sampler_logps=sampler,
                    truncated=sample.get('status') == 'truncated',
                    prompt_text=prompt if isinstance(prompt, str) else None,
                    completion_text=sample.get('response'))


def read(path, *, reward_key=None, advantage='grpo'):
  """The `Rollout` records of one slime debug rollout file (module docstring)."""
  data = load(path)
  step = data.get('rollout_id')
  step = step if isinstance(step, int) and not isinstance(step, bool) else -1
  out = [_sample(s, f'{path} sample {i}', step, reward_key) for i, s in enumerate(data['samples'])]
  if not out:
    raise rl.DumpError(path, 'samples', 'empty')
  rl.fill_advantages(out, advantage)
  return out, {'format': 'slime', 'point': 'behaviour', 'advantage': advantage}
