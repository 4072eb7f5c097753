"""Known-positive controls for `jtc conform`: losses with the per-token weight bugs reported against
RL frameworks, each written as the plain torch function the bug makes (the signature conform
checks). tests/interop/test_conform.py asserts that each is flagged by the check its bug breaks."""
import torch


def _token_mean(x, mask, num_tokens=None):
  return (x * mask).sum() / (num_tokens or mask.sum().clamp(min=1.0))


def seq_ratio_summed(logp, old_logp, advantages, mask, eps_low=3e-4, eps_high=4e-4, **_):
  """GSPO whose sequence ratio sums the token log-ratios instead of averaging them (TRL #5814:
  exp(sum) where exp(mean) is meant). Flagged by: gradient."""
  log_r = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
  s = torch.exp(log_r.sum(-1))  # the bug: sum, not mean
  c = torch.clamp(s, 1 - eps_low, 1 + eps_high)
  s_bar = torch.where(advantages >= 0, torch.minimum(s, c), torch.maximum(s, c))
  per_row = (advantages * s_bar)[:, None] * mask
  return -((per_row * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def exp_sum_weight(logp, old_logp, advantages, mask, eps_low=0.2, eps_high=0.2, **_):
  """Token PPO scaled by a sequence weight exp(sum_t log r) (NeMo RL #2269: a product of
  ratios, tiny on long sequences, down-weights the whole batch). Flagged by: weights."""
  log_r = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
  r = torch.exp(log_r)
  a = advantages[:, None]
  ppo = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
  weight = torch.exp(log_r.sum(-1)).detach()[:, None]  # the bug
  return -((ppo * weight * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def ratio_dropped(logp, old_logp, advantages, mask, **_):
  """A fused GRPO loss without the importance ratio: -A log pi (Liger-Kernel #1088): right on
  policy, wrong as soon as the ratio moves. Flagged by: gradient."""
  per_token = -advantages[:, None] * logp
  return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def ratio_stop_gradient(logp, old_logp, advantages, mask, eps_low=0.2, eps_high=0.2, **_):
  """PPO with the gradient stopped through the ratio (mlx-lm-lora #55): the policy gradient is
  exactly zero. Flagged by: weights (0) and gradient."""
  r = torch.exp(logp - old_logp).detach()  # the bug
  a = advantages[:, None]
  ppo = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
  return -((ppo * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def microbatch_token_mean(logp, old_logp, advantages, mask, eps_low=0.2, eps_high=0.28, **_):
  """DAPO's token mean over the micro-batch it is given (verl #5625 / #7321 / #7200,
  open-instruct #1728): right on a whole batch, wrong once micro-batches hold different token
  counts and are averaged. Flagged by: micro-batch (the full batch's gradient is right)."""
  r = torch.exp(torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)))
  a = advantages[:, None]
  ppo = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
  return -_token_mean(ppo, mask)


# name -> (objective, aggregation, the check that must flag it)
CONTROLS = {
    'seq_ratio_summed': ('gspo', 'seq_mean_token_mean', 'gradient'),
    'exp_sum_weight': ('grpo', 'seq_mean_token_mean', 'weights'),
    'ratio_dropped': ('grpo', 'seq_mean_token_mean', 'gradient'),
    'ratio_stop_gradient': ('grpo', 'seq_mean_token_mean', 'weights'),
    'microbatch_token_mean': ('dapo', 'token_mean', 'micro-batch'),
}
