"""Other frameworks' loss signatures as the one `jtc conform` checks, calling the installed package:

  jtc conform --loss jtc.interop.conform_adapters:verl_policy_loss --objective grpo \
      --aggregation token_mean --accumulation sum \
      --hparams policy_loss=vanilla,loss_agg_mode=token-mean,eps_low=0.2,eps_high=0.2,dual_clip_c=3

* `verl_policy_loss`: verl's ``get_policy_loss_fn(policy_loss)(old_log_prob, log_prob,
  advantages [B, T], response_mask, loss_agg_mode, config=ActorConfig)`` and its ``agg_loss``
  (``verl/trainer/ppo/core_algos.py``). Its trainer normalises every micro-batch by the global
  batch (``config.global_batch_info``: dp_size, batch_num_tokens, global_batch_size,
  loss_scale_factor) and adds the micro-batch losses up (``verl/workers/utils/losses.py``
  ``ppo_loss``): check it with ``--accumulation sum``. The clip keys are jtc's (eps_low, eps_high,
  dual_clip_c -> clip_ratio_low, clip_ratio_high, clip_ratio_c); verl's 'vanilla' always applies
  the dual clip (clip_ratio_c 3.0 by default), so it is jtc's grpo / dapo with dual_clip_c=3.
  verl's 'gspo' is jtc's gspo_token (the sequence ratio on every token, clipped per token).
* `trl_grpo_loss`: TRL's ``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``), called
  with a stand-in for the trainer that returns the given log-probs as the model's (one process, no
  vLLM, no entropy bonus or masking). ``loss_type`` 'grpo' / 'bnpo' / 'dr_grpo' divide by the
  gradient-accumulation steps (``--accumulation mean``); 'dapo' / 'cispo' by the global token
  count over the processes (``--accumulation sum``).
* `prime_rl_loss`: prime-rl's ``compute_loss`` around a per-sample loss (``loss_fn``, default its
  ``default_loss_fn``: DPPO + KL, ``src/prime_rl/trainer/rl/loss.py``): the per-sample losses
  summed and divided by the step's loss-token count (``--accumulation sum``). ``loss_fn`` may name
  any function of prime-rl's per-sample signature (``fn(inputs, **kwargs) -> outputs.loss``).
Each raises `conform_grad.LossError` (one line) when its package does not import.

Dimension key (docs/dimensions.md): B rows, T completion length.
"""

import types

from jtc.interop import conform_grad


def _need(module, package):
  import importlib  # pylint: disable=import-outside-toplevel
  try:
    return importlib.import_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise conform_grad.LossError(f'this adapter calls {package}, which does not import here '
                                 f'({type(e).__name__}: {str(e).splitlines()[0][:120]})') from None


_VERL_MODES = {
    'token_mean': 'token-mean',
    'seq_mean_token_mean': 'seq-mean-token-mean',
    'seq_mean_token_sum': 'seq-mean-token-sum',
    'seq_mean_token_sum_norm': 'seq-mean-token-sum-norm'
}


def verl_policy_loss(logp, old_logp, advantages, mask, *, policy_loss='vanilla', loss_agg_mode=None,
                     aggregation='token_mean', eps_low=0.2, eps_high=0.2, dual_clip_c=3.0,
                     num_tokens=None, num_sequences=None, dp_size=1, norm_length=None,
                     group_size=None, token_weights=None, **config):
  """verl's policy loss (module docstring); ``config``: other ActorConfig fields."""
  del group_size, token_weights  # verl's policy losses take neither
  core_algos = _need('verl.trainer.ppo.core_algos', 'verl')
  actor = _need('verl.workers.config', 'verl')
  cfg = actor.ActorConfig(strategy='fsdp', rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                          clip_ratio=eps_low, clip_ratio_low=eps_low, clip_ratio_high=eps_high,
                          clip_ratio_c=dual_clip_c, loss_agg_mode=loss_agg_mode or
                          _VERL_MODES[aggregation],
                          policy_loss=actor.PolicyLossConfig(loss_mode=policy_loss), **config)
  cfg.global_batch_info.update(dp_size=dp_size, batch_num_tokens=num_tokens,
                               global_batch_size=num_sequences, loss_scale_factor=norm_length)
  fn = core_algos.get_policy_loss_fn(policy_loss)
  loss, _ = fn(old_log_prob=old_logp, log_prob=logp, advantages=advantages[:, None] * mask,
               response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg)
  return loss


class _Accelerator:
  """One process: gathering and reducing return what they are given."""
  sync_gradients = True

  def __init__(self, num_processes):
    self.num_processes = num_processes

  def gather(self, x):
    return x

  gather_for_metrics = gather

  def reduce(self, x, reduction='sum'):
    del reduction
    return x


def trl_grpo_loss(logp, old_logp, advantages, mask, *, loss_type='dapo', eps_low=0.2, eps_high=0.2,
                  importance_sampling_level='token', num_tokens=None, dp_size=1,
                  max_completion_length=None, aggregation=None, group_size=None, num_sequences=None,
                  norm_length=None, token_weights=None, **args):
  """TRL's GRPO loss (module docstring); ``args``: GRPOConfig fields the loss reads."""
  del aggregation, group_size, num_sequences, norm_length, token_weights  # TRL takes none
  import collections  # pylint: disable=import-outside-toplevel
  torch = _need('torch', 'torch')
  trainer = _need('trl.trainer.grpo_trainer', 'trl')
  B, T = logp.shape
  state = types.SimpleNamespace(
      loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, beta=0.0,
      importance_sampling_level=importance_sampling_level, top_entropy_quantile=1.0,
      off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=False,
      model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
      accelerator=_Accelerator(dp_size), _entropy_bonus_enabled=False, aux_loss_enabled=False,
      max_completion_length=max_completion_length or T,
      _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
      args=types.SimpleNamespace(
          **{
              'delta': None,
              'use_bias_correction_kl': False,
              'steps_per_generation': 1,
              'sapo_temperature_pos': 1.0,
              'sapo_temperature_neg': 1.05,
              **args
          }), _get_per_token_logps_and_entropies=lambda *a, **k:
      (logp, torch.zeros_like(logp), None))
  ids = torch.zeros((B, T), dtype=torch.long)
  inputs = {
      'prompt_ids': ids[:, :1],
      'prompt_mask': torch.ones((B, 1), dtype=torch.long),
      'completion_ids': ids,
      'completion_mask': mask,
      'advantages': advantages,
      'old_per_token_logps': old_logp,
      'num_items_in_batch': torch.tensor(float(num_tokens or mask.sum())),
  }
  return trainer.GRPOTrainer._compute_loss(state, None, inputs)  # pylint: disable=protected-access


def prime_rl_loss(logp, old_logp, advantages, mask, *,
                  loss_fn='prime_rl.trainer.rl.loss:default_loss_fn', num_tokens=None, dp_size=1,
                  aggregation=None, group_size=None, num_sequences=None, norm_length=None,
                  token_weights=None, **kwargs):
  """prime-rl's compute_loss over rows (module docstring); ``kwargs`` go to ``loss_fn`` (the
  default loss's: a prime-rl ``DefaultLossConfig`` built from them)."""
  del aggregation, group_size, num_sequences, norm_length, token_weights  # prime-rl takes none
  if loss_fn.startswith('prime_rl.'):
    _need(loss_fn.partition(':')[0], 'prime-rl')
    configs = _need('prime_rl.configs.trainer', 'prime-rl')
    kwargs = {'loss_config': configs.DefaultLossConfig(**kwargs)}
  fn = conform_grad.load(loss_fn)
  total = 0.0 * logp.sum()
  for b in range(logp.shape[0]):
    m = mask[b] > 0
    inputs = types.SimpleNamespace(trainer_logprobs=logp[b], inference_logprobs=old_logp[b],
                                   ref_logprobs=None, advantages=advantages[b] + 0.0 * logp[b],
                                   loss_mask=m, loss_weights=None)
    out = fn(inputs, **kwargs)
    total = total + getattr(out, 'loss', out)
  # compute_loss divides by the step's rl-token count; the trainer undoes FSDP's averaging.
  return total / (num_tokens or float(mask.sum())) * dp_size
