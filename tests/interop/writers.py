"""Dumps written as each framework's own writer writes them, for the importers' tests (read from
their sources: prime-rl ``src/prime_rl/trainer/rl/token_export.py`` and ``loss.py`` at 559b447,
slime ``slime/observability/rollout_data_utils.py`` and ``slime/utils/types.py`` at 624b824,
verl ``verl/trainer/ppo/ray_trainer.py`` ``_dump_generations`` and ``core_algos.py`` at b178a3c).
Each writer works on torch tensors and converts them the way the framework does, and each file
also carries the framework's own loss (torch, autograd) to check the imported coefficients
against. Ideas only: the code is the tests'."""
import json
import math
import os

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# prime-rl: token export and the default loss (DPPO + KL) of its rl component.
# ---------------------------------------------------------------------------------------------

PRIME_DPPO = {'dppo_mask_low': 0.2, 'dppo_mask_high': 0.2, 'adv_tau': 1.0, 'kl_tau': 1e-3}


def prime_sequences(rng, *, groups, G, vocab=50, multi_turn=False):
  """Sequences of a prime-rl step: (prompt ids, completion ids, loss mask, advantage) per
  completion, groups of G sharing a prompt; with ``multi_turn`` a tool reply inside each
  completion carries no loss."""
  out = []
  for _ in range(groups):
    prompt = rng.integers(3, vocab, rng.integers(2, 6)).tolist()
    rewards = rng.integers(0, 2, G).astype(float)
    adv = rewards - rewards.mean()
    for i in range(G):
      n = int(rng.integers(1, 7))
      completion = rng.integers(3, vocab, n).tolist()
      mask = [True] * n
      if multi_turn and n > 3:
        mask[1:3] = [False, False]
      out.append((prompt, completion, mask, float(adv[i])))
  return out


def _to_floats(t):
  return [
      None if not math.isfinite(v) else float(v)
      for v in t.detach().to(torch.float32).reshape(-1).tolist()
  ]


def _to_bools(t):
  return [bool(v) for v in t.detach().cpu().reshape(-1).tolist()]


def prime_micro_batch(seqs, rng, *, rl_weights=False, pad=3):
  """One packed micro-batch (prime-rl's keys, batch 1) and the trainer's output: tensors with
  the trainer's log-probs requiring grad."""
  ids, pos, lmask, adv, env, infer, rlw = [], [], [], [], [], [], []
  lengths = []
  for prompt, completion, mask, a in seqs:
    toks = prompt + completion
    ids += toks
    pos += list(range(len(toks)))
    lmask += [False] * len(prompt) + mask
    adv += [a] * len(toks)
    env += ['math'] * len(toks)
    infer += [0.0] * len(prompt) + rng.uniform(-2.5, -0.05, len(completion)).tolist()
    rlw += [1.0] * len(prompt) + rng.choice([1.0, 0.5, 0.0], len(completion)).tolist()
    lengths.append(len(toks))
  ids += [0] * pad  # the packer's padding: env name '' and no loss
  pos += list(range(pad))
  lmask += [False] * pad
  adv += [0.0] * pad
  env += [''] * pad
  infer += [0.0] * pad
  rlw += [0.0] * pad
  lengths[-1] += pad
  infer_t = torch.tensor([infer], dtype=torch.float32)
  trainer = (infer_t + torch.tensor(rng.normal(0, 0.15, infer_t.shape), dtype=torch.float32))
  trainer = trainer.clone().requires_grad_(True)
  batch = {
      'input_ids': torch.tensor([ids]),
      'position_ids': torch.tensor([pos]),
      'loss_mask': torch.tensor([lmask]),
      'advantages': torch.tensor([adv], dtype=torch.float32),
      'inference_logprobs': infer_t,
      'env_names': env,
      'rl_weights': torch.tensor([rlw], dtype=torch.float32) if rl_weights else None,
      'ce_weights': None,
      'ref_kl_weights': None,
      'sequence_lengths': lengths,
  }
  return batch, {'logprobs': trainer, 'entropy': torch.rand(infer_t.shape)}


def prime_loss(batches, outputs, hp=PRIME_DPPO):
  """prime-rl's rl component over a step's micro-batches (every rank's): the sum over sequences
  of default_loss_fn's losses, each micro-batch's divided by the step's rl-token count."""
  scale = 0
  for b in batches:
    w = b['rl_weights']
    scale += int((b['loss_mask'] & (w != 0)).sum()) if w is not None else int(b['loss_mask'].sum())
  scale = max(scale, 1)
  total = 0.0
  for b, out in zip(batches, outputs):
    tl, il, adv, m = out['logprobs'][0], b['inference_logprobs'][0], b['advantages'][0], b[
        'loss_mask'][0]
    w = None if b['rl_weights'] is None else b['rl_weights'][0]
    m = m if w is None else m & (w != 0)
    log_r = tl - il
    r = torch.exp(log_r)
    diff = torch.exp(tl) - torch.exp(il)
    invalid = torch.where(adv > 0, diff > hp['dppo_mask_high'], diff < -hp['dppo_mask_low'])
    keep = m & ~invalid
    per_token = -(keep * hp['adv_tau'] * adv * r) + hp['kl_tau'] * (m * log_r**2)
    if w is not None:
      per_token = per_token * w
    total = total + per_token.sum() / scale
  return total


def write_prime_export(run_dir, step, rank, batches, outputs, hp=PRIME_DPPO):
  """``run_dir/token_exports/step_<step>/rank_<rank>.jsonl`` as prime-rl's TokenExporter writes
  it for ``batches`` (its micro-steps on this rank). Returns {'path:line': (micro_step, start,
  end)}: where each record's tokens sit in its micro-batch."""
  path = os.path.join(run_dir, 'token_exports', f'step_{step}', f'rank_{rank}.jsonl')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  n_file, spans = 0, {}
  with open(path, 'w', encoding='utf-8') as f:
    for micro_step, (b, out) in enumerate(zip(batches, outputs)):
      tl = out['logprobs'].detach()
      il, adv, lm = b['inference_logprobs'], b['advantages'], b['loss_mask']
      log_r = tl - il
      ratio = torch.exp(log_r)
      diff = torch.exp(tl) - torch.exp(il)
      high, low = diff > hp['dppo_mask_high'], diff < -hp['dppo_mask_low']
      pos, neg = adv > 0, adv < 0
      n = tl.numel()
      cols = {
          'token_ids': [int(v) for v in b['input_ids'].reshape(-1).tolist()],
          'position_ids': [int(v) for v in b['position_ids'].reshape(-1).tolist()],
          'loss_mask': _to_bools(lm),
          'advantages': _to_floats(adv),
          'inference_logprobs': _to_floats(il),
          'trainer_logprobs': _to_floats(tl),
          'entropy': _to_floats(out['entropy']),
          'mismatch_kl': _to_floats(ratio - log_r - 1),
          'log_importance_ratio': _to_floats(log_r),
          'importance_ratio': _to_floats(ratio),
          'prob_delta': _to_floats(diff),
          'is_masked': _to_bools(lm & torch.where(pos, high, low)),
          'is_masked_high': _to_bools(lm & pos & high),
          'is_masked_low': _to_bools(lm & neg & low),
          'rl_weights': [None] * n if b['rl_weights'] is None else _to_floats(b['rl_weights']),
          'ce_weights': [None] * n,
          'ref_kl_weights': [None] * n,
          'env_names': list(b['env_names']),
      }
      start = 0
      for k, length in enumerate(b['sequence_lengths']):
        end = start + length
        while end > start and cols['env_names'][end - 1] == '' and not cols['loss_mask'][end - 1]:
          end -= 1
        if end > start and any(cols['loss_mask'][start:end]):
          record = {
              'schema_version': 1,
              'step': step,
              'rank': rank,
              'micro_step': micro_step,
              'micro_sequence_idx': k,
              'export_sequence_idx': n_file,
              'env_name': next((e for e in cols['env_names'][start:end] if e), None),
              **{
                  c: list(v[start:end]) for c, v in cols.items() if c != 'env_names'
              }
          }
          f.write(json.dumps(record, separators=(',', ':'), allow_nan=False) + '\n')
          n_file += 1
          spans[f'{path}:{n_file}'] = (micro_step, start, end)
        start += length
  return spans


# ---------------------------------------------------------------------------------------------
# slime: debug rollout data (torch.save of Sample.to_dict()s).
# ---------------------------------------------------------------------------------------------


def slime_samples(rng, *, groups, G, vocab=50):
  """Sample.to_dict()-shaped dicts of one rollout: G samples per group_index."""
  out = []
  for g in range(groups):
    prompt = rng.integers(3, vocab, rng.integers(2, 6)).tolist()
    for i in range(G):
      n = int(rng.integers(1, 7))
      response = rng.integers(3, vocab, n).tolist()
      out.append({
          'group_index': g,
          'index': g * G + i,
          'rollout_id': None,
          'prompt': f'question {g}',
          'tokens': prompt + response,
          'multimodal_inputs': None,
          'multimodal_train_inputs': None,
          'multimodal_train_input_id': None,
          'apply_chat_template_kwargs': {},
          'response': f'answer {g}.{i}',
          'response_length': n,
          'label': str(g),
          'reward': float(rng.integers(0, 2)),
          'loss_mask': [1] * (n - 1) + [int(rng.integers(0, 2))],
          'weight_versions': ['1'],
          'rollout_log_probs': rng.uniform(-2.0, -0.1, n).tolist(),
          'rollout_top_p_token_ids': None,
          'rollout_top_p_token_offsets': None,
          'rollout_routed_experts': None,
          'remove_sample': False,
          'teacher_log_probs': None,
          'status': 'truncated' if i == 0 else 'completed',
          'metadata': {},
          'generate_function_path': None,
          'custom_rm_path': None,
          'train_metadata': None,
          'session_id': None,
          'non_generation_time': 0.0,
          'spec_info': {
              'spec_accept_token_num': 0,
              'spec_draft_token_num': 0,
              'spec_verify_ct': 0,
              'completion_token_num': 0
          },
          'prefix_cache_info': {
              'cached_tokens': 0,
              'total_prompt_tokens': 0
          },
      })
  return out


def write_slime(dump_details, rollout_id, samples):
  """``<dump_details>/rollout_data/<rollout_id>.pt`` as save_debug_rollout_data writes it."""
  path = os.path.join(dump_details, 'rollout_data', f'{rollout_id}.pt')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  torch.save({'rollout_id': rollout_id, 'samples': samples}, path)
  return path


def slime_advantages(samples, G):
  """slime's _post_process_rewards for grpo with std normalisation: contiguous groups of G."""
  rewards = torch.tensor([s['reward'] for s in samples], dtype=torch.float).reshape(-1, G)
  rewards = rewards - rewards.mean(dim=-1, keepdim=True)
  rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
  return rewards.flatten().tolist()


# ---------------------------------------------------------------------------------------------
# verl: the rollout_data_dir dump (text) and its GRPO advantage.
# ---------------------------------------------------------------------------------------------


def write_verl(rollout_data_dir, step, inputs, outputs, scores, extra):
  """``<rollout_data_dir>/<step>.jsonl`` as _dump_generations writes it."""
  os.makedirs(rollout_data_dir, exist_ok=True)
  path = os.path.join(rollout_data_dir, f'{step}.jsonl')
  n = len(inputs)
  base = {
      'input': inputs,
      'output': outputs,
      'gts': [None] * n,
      'score': scores,
      'step': [step] * n
  }
  for k, v in extra.items():
    if len(v) == n:
      base[k] = v
  lines = [json.dumps({k: v[i] for k, v in base.items()}, ensure_ascii=False) for i in range(n)]
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return path


def verl_grpo(scores, index, eps=1e-6):
  """verl's compute_grpo_outcome_advantage (norm by std) for scalar scores and group ids."""
  scores = torch.tensor(scores, dtype=torch.float32)
  by = {}
  for i, k in enumerate(index):
    by.setdefault(k, []).append(scores[i])
  mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.mean(torch.stack(v)) for k, v in by.items()}
  std = {k: torch.tensor(1.0) if len(v) == 1 else torch.std(torch.stack(v)) for k, v in by.items()}
  return [float((scores[i] - mean[k]) / (std[k] + eps)) for i, k in enumerate(index)]


def rng_for(seed):
  return np.random.default_rng(seed)


def prime_default_loss(inputs, *, dppo_mask_low=0.2, dppo_mask_high=0.2, adv_tau=1.0, kl_tau=1e-3,
                       **_):
  """prime-rl's per-sample default_loss_fn (DPPO + KL), re-expressed: the sum over the sample's
  tokens of -(kept) adv_tau A r + kl_tau (log r)^2 on the loss mask."""
  log_r = inputs.trainer_logprobs - inputs.inference_logprobs
  r = torch.exp(log_r)
  diff = torch.exp(inputs.trainer_logprobs) - torch.exp(inputs.inference_logprobs)
  adv = inputs.advantages
  invalid = torch.where(adv > 0, diff > dppo_mask_high, diff < -dppo_mask_low)
  keep = inputs.loss_mask & ~invalid
  per_token = -(keep * adv_tau * adv * r) + kl_tau * (inputs.loss_mask * log_r**2)
  return per_token.sum()
