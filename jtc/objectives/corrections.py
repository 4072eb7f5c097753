"""Rollout-training mismatch corrections: importance weights between the trainer's behaviour
policy and the distribution the sampler actually drew from.

The sampler's log-probs are of the distribution it sampled from (tempered, top-k / top-p / min-p
filtered and renormalised, in its compute dtype, through the KV cache: `jtc.models.sampler`); the
trainer recomputes the behaviour log-probs with a full forward pass (`rollout.behaviour_logps =
'recompute'`). Their ratio per token, rho_t = pi_train(y_t | h_t) / pi_sampler(y_t | h_t), is the
importance weight that turns an expectation over the sampler's tokens into one over the policy's.
A correction multiplies every token's per-token objective by a weight w (a constant: no gradient
flows through it), before aggregation, for every objective alike (`objectives.compute_loss`
``is_weights``), GSPO, DFPO and DelTA included.

  none      w = 1                                                       (jtc's default)
  tis       w_t = min(rho_t, C)      truncated importance sampling (Yao et al. 2025, "Your
            efficient RL framework secretly brings you off-policy RL training"; verl / TRL
            `vllm_importance_sampling_cap`)
  mis       w_t = rho_t 1[1/C <= rho_t <= C]   masked importance sampling: an outlier token is
            dropped instead of truncated (verl rollout correction, mask mode)
  icepop    w_t = rho_t 1[alpha <= rho_t <= beta]   IcePop's two-sided token mask (Ling Team 2025,
            "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model"; alpha = 0.5,
            beta = 5 there)
  seq_tis   w_i = min(rho_i, C), rho_i = prod_t rho_{i,t}: the sequence's importance weight,
            truncated, on every token of sequence i (verl rollout correction, sequence level)
  seq_mask  w_i = rho_i 1[1/C <= rho_i <= C]: sequence-level masked importance sampling

Dimension key (docs/dimensions.md): B sequences, T completion length.
"""

import chex
import jax
import jax.numpy as jnp

CORRECTIONS = ('none', 'tis', 'mis', 'icepop', 'seq_tis', 'seq_mask')


def log_ratio(train_logps_BT, sampler_logps_BT, mask_BT):
  """log rho = log pi_train - log pi_sampler on real tokens (0 elsewhere): the per-token mismatch
  delta_t that `mismatch_metrics` summarises."""
  chex.assert_equal_shape([train_logps_BT, sampler_logps_BT, mask_BT])
  return jnp.where(mask_BT > 0, train_logps_BT - sampler_logps_BT, 0.0)


def weights(name, train_logps_BT, sampler_logps_BT, mask_BT, *, cap=2.0, icepop_low=0.5,
            icepop_high=5.0):
  """(w_BT, metrics): the correction ``name``'s weights (module docstring), 0 on padding, as
  constants, and the share of real tokens it truncated ('frac_truncated') or masked
  ('frac_masked')."""
  if name not in CORRECTIONS:
    raise ValueError(f'unknown correction {name!r}; valid: {list(CORRECTIONS)}')
  real_BT = mask_BT > 0
  # The behaviour policy's and the sampler's log-probs are data: the weights are constants.
  log_rho_BT = jax.lax.stop_gradient(log_ratio(train_logps_BT, sampler_logps_BT, mask_BT))
  rho_BT = jnp.exp(log_rho_BT)
  n = jnp.maximum(jnp.sum(real_BT), 1)
  if name.startswith('seq_'):  # one weight per sequence: rho_i = prod_t rho_{i,t}
    rho_BT = jnp.broadcast_to(jnp.exp(jnp.sum(log_rho_BT, axis=-1))[:, None], rho_BT.shape)
  low, high = (icepop_low, icepop_high) if name == 'icepop' else (1.0 / cap, cap)
  outside_BT = real_BT & ((rho_BT < low) | (rho_BT > high))
  if name == 'none':
    w_BT, truncated_BT, masked_BT = jnp.ones_like(rho_BT), None, None
  elif name in ('tis', 'seq_tis'):  # truncated: only the upper cap acts
    w_BT, truncated_BT, masked_BT = jnp.minimum(rho_BT, cap), real_BT & (rho_BT > cap), None
  else:  # mis, icepop, seq_mask: masked outside [low, high]
    w_BT, truncated_BT, masked_BT = jnp.where(outside_BT, 0.0, rho_BT), None, outside_BT
  share = lambda x_BT: jnp.float32(0.0) if x_BT is None else jnp.sum(x_BT) / n
  metrics = {
      'frac_truncated': share(truncated_BT),
      'frac_masked': share(masked_BT),
      'weight_mean': jnp.sum(jnp.where(real_BT, w_BT, 0.0)) / n
  }
  return jnp.where(real_BT, w_BT, 0.0), metrics


def check(name, *, cap, icepop_low, icepop_high, behaviour_logps):
  """The `rollout` section's correction keys, before any compute."""
  if name not in CORRECTIONS:
    raise ValueError(f'config.rollout.correction={name!r} is not valid; valid: {list(CORRECTIONS)}')
  if not cap > 1:
    raise ValueError(f'config.rollout.correction_cap={cap!r} must be > 1 (the weights are capped '
                     'at C and masked outside [1/C, C])')
  if not 0 < icepop_low < 1 < icepop_high:
    raise ValueError(f'config.rollout.icepop_low={icepop_low!r} / icepop_high={icepop_high!r} '
                     'must satisfy 0 < low < 1 < high')
  if name != 'none' and behaviour_logps != 'recompute':
    raise ValueError(
        f'config.rollout.correction={name!r} with config.rollout.behaviour_logps='
        f'{behaviour_logps!r}: with the sampler\'s log-probs as the behaviour policy the PPO ratio '
        'pi / pi_sampler already is the importance weight; a correction weighs the trainer\'s '
        "recomputed behaviour policy against the sampler's, so it needs behaviour_logps='recompute'"
    )


def mismatch_metrics(train_logps_BT, sampler_logps_BT, mask_BT, *, cap=2.0):
  """The step's `mismatch/*` metrics of delta_t = log pi_train - log pi_sampler: mean |delta|,
  max |delta|, the 99th percentile of |delta| over real tokens, the mean delta (its bias), the
  mean |sum_t delta_t| per sequence (log of the sequence's importance weight), and the share of
  tokens with |delta| > 0.01 and with rho outside [1/C, C]."""
  d_BT = log_ratio(train_logps_BT, sampler_logps_BT, mask_BT)
  real_BT = mask_BT > 0
  n = jnp.maximum(jnp.sum(real_BT), 1)
  a_BT = jnp.where(real_BT, jnp.abs(d_BT), 0.0)
  # 99th percentile over real tokens: padding as -inf sorts first.
  flat = jnp.sort(jnp.where(real_BT, a_BT, -jnp.inf).ravel())
  k = jnp.clip(flat.shape[0] - n + jnp.ceil(0.99 * n).astype(jnp.int32) - 1, 0, flat.shape[0] - 1)
  return {
      'mean_abs': jnp.sum(a_BT) / n,
      'max_abs': jnp.max(a_BT),
      'p99_abs': jnp.maximum(flat[k], 0.0),
      'mean': jnp.sum(d_BT) / n,
      'seq_mean_abs': jnp.mean(jnp.abs(jnp.sum(d_BT, axis=-1))),
      'frac_above_0.01': jnp.sum(a_BT > 0.01) / n,
      'frac_beyond_cap': jnp.sum(real_BT & (a_BT > jnp.log(cap))) / n
  }
