"""From a step's rollouts to the update's `update.Batch` on the device (once per step):
rewards -> advantages -> token mask -> behaviour log-probs -> KL reference -> token weights
(DelTA) -> the rollout-training mismatch and its correction's weights.

Dimension key (docs/dimensions.md): B sequences, T completion length, L = P + T, V vocabulary.
"""

import functools

import jax.numpy as jnp
import numpy as np

from jtc.analysis import diagnostics
from jtc.analysis import mismatch_lag
from jtc.objectives import advantages as advantages_lib
from jtc.objectives import corrections
from jtc.rl import evaluation
from jtc.rl import population as population_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import routing
from jtc.rl import sharding as sharding_lib
from jtc.rl.update import Batch


def make_batch(config, rollouts, params, run_state, *, task, behaviour_fn, ref_params, to_device,
               weights_fn=None, rng=None, population=population_lib.SINGLE, proximal_params=None,
               version=None):
  """Rollouts (one per member) -> `Batch` on the device; returns (batch, each member's rollout
  metrics, run_state).

  ``params`` is the policy that sampled the rollouts (the behaviour policy). Under a policy lag
  (config.rollout.policy_lag > 0) that is an older policy than the one about to be updated,
  ``proximal_params``: its log-probs are then measured too (`lag_metrics`) and, with
  ``config.rollout.policy_lag_mode == 'decoupled'``, they centre the clip while pi_prox / pi_behav
  weighs every token (`decoupled_weights`).

  Rewards (+ DAPO overlong shaping) -> advantages (``config.advantage``) -> the token mask (minus
  truncated completions with ``config.dapo.mask_truncated``) -> behaviour log-probs of ``params``
  (``behaviour_fn``, a jitted `rollout.behaviour_pass`, `rollout.score_chunk_prompts` groups at a
  time; or the sampler's, by ``config.rollout.behaviour_logps``) -> the KL reference's (when
  ``ref_params``) -> the rollout-training mismatch against the sampler's log-probs (`mismatch/*`
  metrics) and its correction's weights (``config.rollout.correction``, `jtc.objectives.corrections`)
  -> token weights of ``weights_fn`` (a token-weight plug-in's, e.g. DelTA's `Step.delta`) from
  the behaviour pass. ``run_state`` comes back with the plug-in's state and the token counts
  updated. Every device value carries the population's member axis
  (`population.Population.stack`). ``version``: the policy version of ``params`` (partial
  rollouts: the mismatch is also split by each token's lag behind it, `mismatch_lag`).
  """
  host = [_host_batch(config, r) for r in rollouts]
  stack = lambda key: population.stack([h[key] for h in host])
  tokens, input_mask = population.stack([r.tokens_BL for r in rollouts
                                        ]), population.stack([r.input_mask_BL for r in rollouts])
  tokens_BL, input_mask_BL = to_device(tokens), to_device(input_mask)
  # A MoE policy's sampled experts; those the behaviour pass and the updates replay (`routing`).
  experts = None if rollouts[0].experts_BLYW is None else population.stack(
      [r.experts_BLYW for r in rollouts])
  replay = routing.replay_experts(experts, config.rollout.routing_replay, config.data.prompt_width)
  score = functools.partial(
      rollout_lib.behaviour_logps, behaviour_fn, tokens_BL=tokens_BL, input_mask_BL=input_mask_BL,
      host_tokens_BL=tokens, host_input_mask_BL=input_mask, to_device=to_device,
      chunk_rows=rollout_lib.score_chunk_prompts(config.rollout) *
      config.rollout.sampling.num_samples, axis=1 if population.batched else 0,
      host_replay_BLYW=replay)
  # The trainer's behaviour log-probs: the ratios' denominator (behaviour_logps='recompute'), the
  # mismatch measured against the sampler's, DelTA's hidden states.
  behaviour = score(params)
  sampler_logps = to_device(population.stack([r.sampler_logps_BT for r in rollouts]))
  recompute = config.rollout.behaviour_logps == 'recompute'
  batch = Batch(
      tokens_BL=tokens_BL, input_mask_BL=input_mask_BL, mask_BT=to_device(stack('mask_BT')),
      advantages_B=to_device(stack('adv_B')),
      old_logps_BT=behaviour['logps'] if recompute else sampler_logps, ref_logps_BT=None
      if ref_params is None else score(ref_params, host_replay_BLYW=None)['logps'],
      replay_BLYW=None if replay is None else to_device(replay))
  metrics = [h['metrics'] for h in host]
  real_BT = to_device(population.stack([r.completion_mask_BT for r in rollouts]))
  batch, step_metrics = _off_policy(
      config, batch, behaviour['logps'], sampler_logps, real_BT,
      proximal_logps=None if proximal_params is None else score(proximal_params)['logps'],
      population=population)
  if experts is not None:  # routing flips: the sampler's experts vs the behaviour pass's router
    step_metrics.update({
        f'mismatch/{k}': v
        for k, v in population.map(routing.step_metrics)(to_device(experts[
            ..., config.data.prompt_width:, :, :]), behaviour['experts'], behaviour['logps'] -
                                                         sampler_logps, real_BT).items()
    })
  for m, values in zip(metrics, population.unstack(sharding_lib.to_host(step_metrics))):
    m.update({k: float(v) for k, v in values.items()})
  if version is not None and rollouts[0].versions_BT is not None:  # partial rollouts: per lag
    for m, r, train_BT in zip(metrics, rollouts,
                              population.unstack(sharding_lib.to_host(behaviour['logps']))):
      m.update({
          f'mismatch/{k}': v
          for k, v in mismatch_lag.by_lag(train_BT, r.sampler_logps_BT, r.completion_mask_BT,
                                          mismatch_lag.lag_BT(r.versions_BT, version),
                                          cap=config.rollout.correction_cap).items()
      })
  completion_BT = population.stack([r.completion_BT for r in rollouts])
  if weights_fn is not None:
    inputs = dict(tokens_BL=batch.tokens_BL, input_mask_BL=batch.input_mask_BL,
                  replay_BLYW=batch.replay_BLYW)  # what a recomputing plug-in's forward reads
    weights_BT, weight_metrics, weighter_state = weights_fn(run_state.weighter, params, behaviour,
                                                            inputs, to_device(completion_BT),
                                                            to_device(stack('adv_B')),
                                                            to_device(stack('mask_BT')), rng)
    batch = batch.replace(token_weights_BT=weights_BT)
    for m, wm in zip(metrics, population.unstack(sharding_lib.to_host(weight_metrics))):
      m.update({f'{config.token_weights}/{k}': float(v) for k, v in wm.items()})
    run_state = run_state.replace(weighter=weighter_state)
  run_state = run_state.replace(token_counts_V=population.map(diagnostics.update_token_counts)(
      run_state.token_counts_V, jnp.asarray(completion_BT), batch.mask_BT))
  for m, r in zip(metrics, rollouts):
    m.update(accuracy=float(r.correct_B.mean()), response_length=float(r.lengths_B.mean()),
             response_length_p99=float(np.percentile(r.lengths_B, 99)),
             frac_truncated=float(r.truncated_B.mean()),
             **evaluation.format_metrics(task, r.texts, r.correct_B))
  return batch, metrics, run_state


def _off_policy(config, batch, behaviour_logps, sampler_logps, real_BT, *, proximal_logps,
                population):
  """The rollout-training mismatch (`mismatch/*`), its correction's weights
  (``config.rollout.correction``) and, under a policy lag, the lag's metrics and the decoupled
  weights; returns (batch, metrics on the device)."""
  step_metrics = {
      f'mismatch/{k}': v for k, v in population.map(
          functools.partial(corrections.mismatch_metrics, cap=config.rollout.correction_cap))(
              behaviour_logps, sampler_logps, real_BT).items()
  }
  if config.rollout.correction != 'none':
    is_weights, correction_metrics = population.map(
        functools.partial(corrections.weights, config.rollout.correction,
                          cap=config.rollout.correction_cap, icepop_low=config.rollout.icepop_low,
                          icepop_high=config.rollout.icepop_high))(behaviour_logps, sampler_logps,
                                                                   batch.mask_BT)
    batch = batch.replace(is_weights_BT=is_weights)
    step_metrics.update({f'correction/{k}': v for k, v in correction_metrics.items()})
  if proximal_logps is not None:
    step_metrics.update({
        f'lag/{k}': v
        for k, v in population.map(lag_metrics)(proximal_logps, behaviour_logps, real_BT).items()
    })
    if config.rollout.policy_lag_mode == 'decoupled':
      weights_BT = population.map(decoupled_weights)(proximal_logps, behaviour_logps, batch.mask_BT)
      if batch.is_weights_BT is not None:
        weights_BT = weights_BT * batch.is_weights_BT
      batch = batch.replace(old_logps_BT=proximal_logps, is_weights_BT=weights_BT)
  return batch, step_metrics


def _host_batch(config, rollout):
  """One member's host-side batch: shaped rewards -> advantages (``config.advantage``) and the token
  mask; {'adv_B', 'mask_BT', 'metrics'}."""
  rewards_B = rollout.rewards_B + rollout_lib.overlong_shaping(
      rollout.lengths_B, max_new_tokens=config.rollout.sampling.max_new_tokens,
      buffer=config.dapo.overlong_buffer, penalty=config.dapo.overlong_penalty)
  adv_B, adv_metrics = advantages_lib.compute_advantages(
      config.advantage.name, jnp.asarray(rewards_B), group_size=config.rollout.sampling.num_samples,
      eps=config.advantage.eps, std_ddof=config.advantage.std_ddof,
      batch_normalize=config.advantage.batch_normalize)
  adv_B = advantages_lib.keep_sign(adv_B, config.advantage.sign)
  mask_BT = rollout.completion_mask_BT.astype(np.float32)
  if config.dapo.mask_truncated:
    mask_BT = mask_BT * (~rollout.truncated_B)[:, None]
  metrics = {f'adv/{k}': float(v) for k, v in adv_metrics.items()}
  metrics.update(reward_mean=float(rewards_B.mean()), reward_std=float(rewards_B.std()))
  return {'adv_B': np.asarray(adv_B), 'mask_BT': mask_BT, 'metrics': metrics}


def lag_metrics(proximal_logps_BT, behaviour_logps_BT, mask_BT):
  """How far the policy about to be updated (proximal) has moved from the lagged one that
  sampled: over the real tokens, mean |log pi_prox - log pi_behav| ('abs_log_ratio'), the
  standard deviation of that log-ratio ('log_ratio_std') and its largest absolute value
  ('abs_log_ratio_max'). All are 0 without a lag."""
  m = mask_BT > 0
  n = jnp.maximum(jnp.sum(m), 1)
  d_BT = jnp.where(m, proximal_logps_BT - behaviour_logps_BT, 0.0)
  mean = jnp.sum(d_BT) / n
  return {
      'abs_log_ratio': jnp.sum(jnp.abs(d_BT)) / n,
      'log_ratio_std': jnp.sqrt(jnp.sum(jnp.where(m, (d_BT - mean)**2, 0.0)) / n),
      'abs_log_ratio_max': jnp.max(jnp.abs(d_BT)),
  }


def decoupled_weights(proximal_logps_BT, behaviour_logps_BT, mask_BT):
  """[B, T] pi_prox / pi_behav per token (0 on padding): the importance weight of decoupled PPO
  (Hilton et al., 2022, "Batch size-invariance for policy optimization"), which corrects
  for sampling from the lagged behaviour policy while the clip is taken around the proximal
  policy (the parameters at the start of this step). Uncapped, so the correction is exact."""
  return jnp.where(mask_BT > 0, jnp.exp(proximal_logps_BT - behaviour_logps_BT), 0.0)
