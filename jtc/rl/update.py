"""The optimisation half of an RL step: train state, optimiser, batch, mini-batches, updates.

`Batch` is what the update consumes (`jtc.rl.batch.make_batch` builds it from a step's
rollouts); `run_updates` takes ppo_epochs x mini-batches of whole groups, sliced on the device by
`minibatch`, through `update_step` (jit it with ``donate_argnums=0``), which accumulates the
gradients of its micro-batches exactly (`microbatch_weights`).

Dimension key (docs/dimensions.md): B sequences, G group size, T completion length, L = P + T,
n micro-batches per mini-batch, E population members.
"""

import functools

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jtc import checks
from jtc.models import logprobs
from jtc import objectives
from jtc.rl import minibatch_order as minibatch_order_lib
from jtc.rl import population as population_lib
from jtc.rl import routing
from jtc.rl import sharding as sharding_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState


COUNTERS = ('rl_steps', 'generated_tokens', 'rollouts', 'update_steps', 'prompts')


@flax.struct.dataclass
class RunState:
  """What a run carries between steps besides the train state (checkpointed as arrays):
  counters int64 [5] (`COUNTERS`), token_counts_V float32 [V] (the Energy diagnostic's
  frequency buckets), the token-weight plug-in's state (DelTA's token cloud) or None, and, with
  config.rollout.policy_lag = k > 0, the parameters of the last k steps, oldest first
  (`lagged_params`: the policy that samples is lagged_params[0])."""
  counters: np.ndarray
  token_counts_V: jax.Array
  weighter: object = None
  lagged_params: tuple = ()

  @classmethod
  def init(cls, vocab_size, weighter_state=None):
    return cls(counters=np.zeros(len(COUNTERS), np.int64), token_counts_V=jnp.zeros(
        (vocab_size,), jnp.float32), weighter=weighter_state)

  def count(self, name):
    """The counter ``name``: an int, or [E] int64 for a population (counters [E, 5])."""
    value = self.counters[..., COUNTERS.index(name)]
    return int(value) if np.ndim(value) == 0 else value

  def add(self, **increments):
    """Counters plus ``increments`` (ints, or [E] arrays for a population)."""
    counters = self.counters.copy()
    for k, v in increments.items():
      counters[..., COUNTERS.index(k)] += v
    return self.replace(counters=counters)


@flax.struct.dataclass
class Batch:
  """What the update consumes, [B, ...] per leaf (a mini-batch: [n, B/n, ...]).

  tokens_BL / input_mask_BL: the rollouts (prompt then completion); mask_BT: the tokens that
  carry gradient; advantages_B; old_logps_BT: behaviour log-probs; ref_logps_BT (KL reference),
  token_weights_BT (DelTA's), is_weights_BT (the correction's, `jtc.objectives.corrections`),
  replay_BLYW (a MoE policy's replayed experts, `jtc.rl.routing`) or None.
  """
  tokens_BL: jax.Array
  input_mask_BL: jax.Array
  mask_BT: jax.Array
  advantages_B: jax.Array
  old_logps_BT: jax.Array
  ref_logps_BT: jax.Array | None = None
  token_weights_BT: jax.Array | None = None
  is_weights_BT: jax.Array | None = None
  replay_BLYW: jax.Array | None = None


# --- Optimiser.


def updates_per_step(optim, prompts_per_step):
  """Optimiser steps per RL step: ppo_epochs x mini-batches."""
  return optim.ppo_epochs * (prompts_per_step // optim.minibatch_prompts)


def learning_rate_schedule(optim, total_updates, learning_rate=None):
  """Linear warm-up over ``warmup_frac`` of the updates, then cosine to ``min_lr_ratio`` x peak;
  the peak is ``optim.learning_rate`` or ``learning_rate`` (a population member's, traced)."""
  if isinstance(learning_rate, jax.Array):  # traced: the schedule is linear in its peak
    unit = learning_rate_schedule(optim, total_updates, 1.0)
    return lambda count: learning_rate * unit(count)
  peak = optim.learning_rate if learning_rate is None else learning_rate
  warmup = int(round(optim.warmup_frac * total_updates))
  return optax.warmup_cosine_decay_schedule(init_value=0.0 if warmup else peak, peak_value=peak,
                                            warmup_steps=warmup,
                                            decay_steps=max(total_updates, warmup + 1),
                                            end_value=peak * optim.min_lr_ratio)


ADAM_EPS = 1e-8  # AdamW's epsilon (optax's default), added to sqrt(v_hat)


def make_optimizer(optim, total_updates, learning_rate=None):
  """Global-norm clipping (``grad_clip`` > 0) then AdamW on the schedule above."""
  return optax.chain(
      optax.clip_by_global_norm(optim.grad_clip) if optim.grad_clip > 0 else optax.identity(),
      optax.adamw(learning_rate_schedule(optim, total_updates, learning_rate), b1=optim.adam_b1,
                  b2=optim.adam_b2, eps=ADAM_EPS, weight_decay=optim.weight_decay))


def adam_direction_norm(opt_state, params, optim):
  """||m_hat / (sqrt(v_hat) + eps) + weight_decay * params||: the l2 norm of the step AdamW takes
  before the learning rate scales it (the update is -lr_t times this direction), from the moments
  in ``opt_state`` after an update and the ``params`` it was applied to. With the learning rate
  factored out, it says how large a step the objective's gradients ask for, whatever the rate."""
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  adam = next(s for s in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(s))
  count = adam.count.astype(jnp.float32)
  m_fix, v_fix = 1 - optim.adam_b1**count, 1 - optim.adam_b2**count
  direction = jax.tree.map(
      lambda m, v, p: (m / m_fix) / (jnp.sqrt(v / v_fix) + ADAM_EPS) + optim.weight_decay * p,
      adam.mu, adam.nu, params)
  return optax.tree.norm(direction)


def init_state(params, optimizer, *, param_shardings, replicated, population=population_lib.SINGLE):
  """(TrainState, its shardings): the params placed with ``param_shardings``, the optimiser
  state sharded like the params it mirrors (its scalars replicated), step 0. A population's
  members start from the same host ``params``, broadcast to [E, ...] on the device."""
  pop = population
  if pop.batched:
    broadcast = lambda p: jax.tree.map(lambda x: jnp.broadcast_to(x, (pop.n,) + x.shape), p)
    params = jax.jit(broadcast, out_shardings=param_shardings)(params)
  else:
    params = jax.tree.map(sharding_lib.to_device, params, param_shardings)
  init = pop.map(optimizer.init)
  shardings = state_shardings(params, optimizer, param_shardings=param_shardings,
                              replicated=replicated, population=pop)
  opt_sh = shardings.opt_state
  step = np.zeros((pop.n,) if pop.batched else (), np.int32)
  state = TrainState(step=sharding_lib.to_device(step, replicated), params=params,
                     opt_state=jax.jit(init, out_shardings=opt_sh)(params))
  return state, shardings


def state_shardings(params, optimizer, *, param_shardings, replicated,
                    population=population_lib.SINGLE):
  """The `TrainState` of shardings for ``params`` (arrays or ShapeDtypeStructs, with a member
  axis for a population): the optimiser state sharded like the params it mirrors, its scalars
  and the step replicated."""
  opt_shapes = jax.eval_shape(population.map(optimizer.init), params)
  opt_sh = optax.tree_map_params(optimizer, lambda _, sh: sh, opt_shapes, param_shardings,
                                 transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=param_shardings, opt_state=opt_sh)


def microbatch_prompts(optim):
  """Prompts per forward/backward pass: ``microbatch_prompts``, or the whole mini-batch (0)."""
  return optim.microbatch_prompts or optim.minibatch_prompts


def num_microbatches(optim):
  """n: micro-batches per mini-batch (1 = no gradient accumulation)."""
  return optim.minibatch_prompts // microbatch_prompts(optim)


def check_config(optim, prompts_per_step):
  """The `optim` section against the rollout batch it splits."""
  checks.positive('optim.learning_rate', optim.learning_rate)
  checks.positive_int('optim.ppo_epochs', optim.ppo_epochs)
  checks.positive_int('optim.minibatch_prompts', optim.minibatch_prompts)
  checks.in_range('optim.warmup_frac', optim.warmup_frac, low=0.0, high=1.0, high_open=True)
  checks.in_range('optim.min_lr_ratio', optim.min_lr_ratio, low=0.0, high=1.0)
  checks.in_range('optim.weight_decay', optim.weight_decay, low=0.0)
  checks.in_range('optim.grad_clip', optim.grad_clip, low=0.0)
  checks.in_range('optim.adam_b1', optim.adam_b1, low=0.0, high=1.0, high_open=True)
  checks.in_range('optim.adam_b2', optim.adam_b2, low=0.0, high=1.0, high_open=True)
  if prompts_per_step % optim.minibatch_prompts:
    raise ValueError(f'config.rollout.prompts_per_step={prompts_per_step} is not divisible by '
                     f'config.optim.minibatch_prompts={optim.minibatch_prompts}')
  if optim.microbatch_prompts < 0 or (optim.microbatch_prompts and
                                      optim.minibatch_prompts % optim.microbatch_prompts):
    raise ValueError(f'config.optim.microbatch_prompts={optim.microbatch_prompts} must be 0 '
                     f'(off) or a divisor of config.optim.minibatch_prompts='
                     f'{optim.minibatch_prompts}')


# --- Mini-batches.


def minibatch_rows(order_M, start, num_prompts, group_size):
  """[num_prompts * G] row indices of the groups order_M[start:start + num_prompts]."""
  groups = np.asarray(order_M)[start:start + num_prompts]
  return (groups[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)


def minibatch(batch, rows, *, num_micro):
  """The rows of ``batch`` as n = ``num_micro`` micro-batches [n, len(rows)/n, ...] (on device;
  jit it with out_shardings to place them)."""
  return jax.tree.map(lambda x: x[rows].reshape((num_micro, -1) + x.shape[1:]), batch)


def microbatch_weights(mask_nBT, *, aggregation):
  """w_n: how much micro-batch k's loss counts in the loss of the whole mini-batch.

  The mini-batch loss is sum_k w_k loss_k exactly when
    token_mean:  w_k = t_k / t   (t_k real tokens of micro-batch k, t of the mini-batch; DelTA
                                  too: its coefficients arrive normalised, the loss is a token mean);
    seq_mean_* / seq_mean_token_sum_norm:  w_k = 1 / n   (equal-size micro-batches).
  Sequence-level transforms (GSPO, DFPO) act within a group and groups never straddle
  micro-batches, so they are unaffected.

  Args:
    mask_nBT: [n, B, T] real-token mask of each micro-batch.
    aggregation: the loss's aggregation (`objectives.AGGREGATIONS`).

  Returns:
    w_n float32 [n], summing to 1.
  """
  chex.assert_rank(mask_nBT, 3)
  n = mask_nBT.shape[0]
  if aggregation != 'token_mean':
    return jnp.full((n,), 1.0 / n, jnp.float32)
  z_n = jnp.sum((mask_nBT > 0).astype(jnp.float32), axis=(1, 2))
  total = jnp.sum(z_n)
  return jnp.where(total > 0, z_n / jnp.where(total > 0, total, 1.0), 1.0 / n)


def _combine_metrics(metrics_n, w_n):
  """Per-micro-batch metrics -> mini-batch metrics: max of *_max, min of *_min, else sum w m."""
  combine = lambda k, v_n: (jnp.max(v_n) if k.endswith('_max') else jnp.min(v_n)
                            if k.endswith('_min') else jnp.sum(w_n * v_n))
  return {k: combine(k, v_n) for k, v_n in metrics_n.items()}


# --- The update.


def update_step(state, batch, hparams=None, frozen=None, *, model_config, optimizer, loss_name,
                loss_hparams, completion_start, group_size, optim=None, row_sharding=None,
                router_aux_coef=0.0):
  """One optimiser step on a mini-batch of whole groups; returns (state, metrics).

  ``batch`` is a `Batch` with leaves [n, B/n, ...]: n micro-batches of whole groups. Their gradients
  are accumulated in float32 with `microbatch_weights` (n = 1: a plain step), so the update equals
  the one on the un-split mini-batch while holding the activations (and, through a barrier, the
  weights' bf16 casts) of one micro-batch only. Metrics: the loss's (`objectives.compute_loss`) plus
  loss, grad / update / param l2 norms and, given the ``optim`` config section, the norm of AdamW's
  direction before the learning rate (`adam_direction_norm`, 'adam_step_norm'). ``row_sharding``:
  the activations' rows constrained to it (`logprobs.sequence_logprobs`). ``hparams``: a population
  member's traced values of the varied keys ('loss.hparams.<k>' override ``loss_hparams``;
  'optim.learning_rate' is passed to ``optimizer``, then a function learning_rate -> optimiser, e.g.
  a partial `make_optimizer`). ``frozen``: a LoRA run's base (`lora.Adapted` without adapters); the
  state's params are then its adapters, trained alone. ``router_aux_coef``: a MoE policy's
  load-balancing loss weight (`routing.add_router_aux`).
  """
  chex.assert_rank([batch.tokens_BL, batch.input_mask_BL, batch.mask_BT], 3)  # [n, B/n, ...]
  chex.assert_rank(batch.advantages_B, 2)
  hparams = hparams or {}
  loss_hparams = population_lib.loss_hparams(loss_hparams, hparams)
  if 'optim.learning_rate' in hparams:
    optimizer = optimizer(hparams['optim.learning_rate'])

  def loss_fn(params, mb):
    policy = params if frozen is None else frozen.replace(adapters=params)
    out = logprobs.sequence_logprobs(policy, model_config, mb.tokens_BL, mb.input_mask_BL,
                                     completion_start=completion_start, row_sharding=row_sharding,
                                     replay_BLYW=mb.replay_BLYW)
    return routing.add_router_aux(
        objectives.compute_loss(loss_name, logps=out['logps'], old_logps=mb.old_logps_BT,
                                advantages=mb.advantages_B, mask=mb.mask_BT, group_size=group_size,
                                ref_logps=mb.ref_logps_BT, token_weights=mb.token_weights_BT,
                                is_weights=mb.is_weights_BT, entropy=out['entropy'],
                                **loss_hparams), out, router_aux_coef)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  n = batch.tokens_BL.shape[0]
  if n == 1:
    (loss, metrics), grads = grad_fn(state.params, jax.tree.map(lambda x: x[0], batch))
  else:
    aggregation = loss_hparams.get('aggregation',
                                   objectives.default_hparams(loss_name)['aggregation'])
    w_n = microbatch_weights(batch.mask_BT, aggregation=aggregation)

    def accumulate(acc, xs):
      mb, w = xs
      (loss, metrics), grads = grad_fn(*jax.lax.optimization_barrier((state.params, mb)))
      acc = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), acc, grads)
      return acc, (loss, metrics)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    grads, (loss_n, metrics_n) = jax.lax.scan(accumulate, zeros, (batch, w_n))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    loss = jnp.sum(w_n * loss_n)
    metrics = _combine_metrics(metrics_n, w_n)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics.update(loss=loss, grad_norm=optax.tree.norm(grads), update_norm=optax.tree.norm(updates),
                 param_norm=optax.tree.norm(params))
  if optim is not None:
    metrics['adam_step_norm'] = adam_direction_norm(opt_state, state.params, optim)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def minibatch_sharding(c, mesh, population=population_lib.SINGLE):
  """The sharding of a mini-batch's [(E,) n, rows, ...] leaves: rows over the batch axes."""
  members = (('members',), (population.n,)) if population.batched else ((), ())
  rows = microbatch_prompts(c.optim) * c.rollout.sampling.num_samples
  return jax.sharding.NamedSharding(
      mesh,
      sharding_lib.logical_to_spec(members[0] + (None, 'batch'),
                                   members[1] + (num_microbatches(c.optim), rows), mesh))


def jit_minibatch_and_update(c, model_config, optimizer, mesh, state_shardings,
                             population=population_lib.SINGLE, frozen_shardings=None):
  """The jitted (minibatch_fn, update_fn) of `run_updates` for config ``c``: mini-batches of whole
  groups sliced on device and sharded over the batch axes; `update_step` donating the state; both
  mapped over the population's members. ``frozen_shardings``: update_fn takes a LoRA run's
  frozen base (`update_step`'s ``frozen``) as a fourth argument, placed with them."""
  pop = population
  minibatch_sh = minibatch_sharding(c, mesh, pop)
  minibatch_fn = jax.jit(pop.map(functools.partial(minibatch, num_micro=num_microbatches(c.optim))),
                         out_shardings=minibatch_sh)
  update_fn = jax.jit(
      pop.map(
          functools.partial(update_step, model_config=model_config, optimizer=optimizer,
                            loss_name=c.loss.name, loss_hparams=c.loss.hparams.to_dict(),
                            completion_start=c.data.prompt_width,
                            group_size=c.rollout.sampling.num_samples, optim=c.optim,
                            row_sharding=sharding_lib.RowSharding(mesh),
                            router_aux_coef=c.loss.get('router_aux_coef', 0.0)),
          spmd=True), in_shardings=(state_shardings, minibatch_sh, state_shardings.step) +
      ((frozen_shardings,) if frozen_shardings is not None else
       ()), out_shardings=(state_shardings, sharding_lib.replicated(mesh)), donate_argnums=(0,))
  return minibatch_fn, update_fn


def _flat(minibatch_batch, batched):
  """A mini-batch [(E,) n, B/n, ...] as one [(E,) B, ...] batch."""
  return jax.tree.map(lambda x: x.reshape(x.shape[:batched] + (-1,) + x.shape[batched + 2:]),
                      minibatch_batch)


def run_updates(state, batch, rng, hparams=None, *, update_fn, minibatch_fn, num_groups,
                minibatch_prompts, ppo_epochs, group_size, diagnose_fn=None, before_update=None,
                population=population_lib.SINGLE, minibatch_order='group'):
  """ppo_epochs x mini-batches (a fresh draw per epoch, fold_in(member's key, epoch)) of whole
  groups, or of rows for another ``minibatch_order`` (`jtc.rl.minibatch_order`); returns
  (state, each member's mean metrics over the updates).

  ``diagnose_fn(params, batch, hparams)``, when given, is measured where the update is taken
  off-policy: on every mini-batch after the first, with the parameters about to be updated (at
  the first one params == behaviour policy: every ratio is 1 and all methods coincide). A step
  with a single update is on-policy by construction: it is measured there and
  'diag/off_policy_points' is 0. ``hparams``: the varied keys' per-member values ({} if none).
  ``before_update(k, params, rows)``, when given, sees the parameters and the rows of each update
  k of the first epoch just before it is taken (the per-token ledger).
  """
  pop, hparams = population, hparams or {}
  keys = pop.unstack(rng)
  n_updates = ppo_epochs * (num_groups // minibatch_prompts)
  update_metrics, diags = [], []
  for epoch in range(ppo_epochs):
    orders = minibatch_order_lib.members_rows(minibatch_order, keys, epoch, batch, pop,
                                              num_groups=num_groups, group_size=group_size,
                                              num_minibatches=num_groups // minibatch_prompts)
    for rows_M in zip(*orders):
      rows = pop.stack(list(rows_M))
      mb = minibatch_fn(batch, jnp.asarray(rows))
      if diagnose_fn is not None and (update_metrics or n_updates == 1):
        diags.append(diagnose_fn(state.params, _flat(mb, pop.batched), hparams))
      if before_update is not None and epoch == 0:
        before_update(len(update_metrics), state.params, rows)
      state, m = update_fn(state, mb, hparams)
      update_metrics.append(m)
  update_metrics, diags = sharding_lib.to_host((update_metrics, diags))
  per_member = [pop.unstack(m) for m in update_metrics]
  out = []
  for i in range(pop.n):
    ms = [m[i] for m in per_member]
    metrics = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
    if diags:
      ds = [pop.unstack(d)[i] for d in diags]
      metrics.update({k: float(np.mean([d[k] for d in ds])) for k in ds[0]})
      metrics['diag/off_policy_points'] = len(ds) if n_updates > 1 else 0
    out.append(metrics)
  return state, out
