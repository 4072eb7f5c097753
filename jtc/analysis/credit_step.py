"""One update measured token by token, several objectives on the same rollouts (issue 54): token
flipping (`flipping`, exact), coupling (`coupling`, first order under the update's own
preconditioning) and gradient mass (`gradient_mass`).

`warm_state` trains a policy for a few RL steps of GRPO (whole groups, 2 mini-batches, AdamW on
the run schedule: `update.update_step`, the trainer's own update) so that the optimiser has
moments; `sample_batch` draws one step's rollouts; `measure` takes one objective's update of a
mini-batch from a given state and measures it. `probe` does the comparison the notebook and
`experiments/credit_probe.py` show: from one state, the step's first mini-batch is updated with
GRPO, then the second (off-policy) mini-batch is updated from the same parameters and Adam state
by each objective in turn.

Dimension key (docs/dimensions.md): B rows (= M * G), M groups, G group size, T completion
length, L = P + T.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jtc import objectives
from jtc.analysis import coupling
from jtc.analysis import diagnostics
from jtc.analysis import flipping
from jtc.analysis import gradient_mass
from jtc.models import logprobs
from jtc.objectives import advantages as advantages_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import update


@dataclasses.dataclass(frozen=True)
class Setting:
  """The probe's sizes (defaults: the table1_confirm step: 16 prompts x G = 8 in 2 mini-batches,
  32 new tokens, peak lr 1e-4 on the 80-step schedule)."""
  prompts: int = 16
  group_size: int = 8
  minibatches: int = 2
  max_new_tokens: int = 32
  prompt_width: int = 20
  learning_rate: float = 1e-4
  schedule_steps: int = 80  # the schedule of an 80-step run
  warm_steps: int = 8  # RL steps of GRPO before the measured one


def _optim(setting):
  from configs import common  # pylint: disable=import-outside-toplevel
  optim = common.get_config().optim
  optim.learning_rate = setting.learning_rate
  return optim


def sample_batch(gen, params, examples, rng, setting):
  """One step's rollouts of ``examples`` under ``params`` as an `update.Batch` (GRPO advantages,
  behaviour log-probs recomputed) and the rewards."""
  sampling = dict(num_samples=setting.group_size, max_new_tokens=setting.max_new_tokens,
                  temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
  r, = rollout_lib.generate(gen, params, [[e['prompt'] for e in examples]],
                            [[e['answer'] for e in examples]], rng, sampling)
  adv_B, _ = advantages_lib.compute_advantages('grpo', jnp.asarray(r.rewards_B),
                                               group_size=setting.group_size)
  tokens, inm = jnp.asarray(r.tokens_BL), jnp.asarray(r.input_mask_BL)
  old = logprobs.sequence_logprobs(params, gen.model_config, tokens, inm,
                                   completion_start=setting.prompt_width)['logps']
  batch = update.Batch(tokens_BL=tokens, input_mask_BL=inm,
                       mask_BT=jnp.asarray(r.completion_mask_BT,
                                           jnp.float32), advantages_B=adv_B, old_logps_BT=old)
  return batch, r.rewards_B


def minibatches(batch, setting, rng):
  """The step's mini-batches of whole groups (a permutation of the groups, as the trainer)."""
  m = setting.prompts
  order = np.asarray(jax.random.permutation(rng, m))
  per = m // setting.minibatches
  return [
      jax.tree.map(
          lambda x, rows=update.minibatch_rows(order, i * per, per, setting.group_size): x[rows]
          if x is not None else None, batch) for i in range(setting.minibatches)
  ]


def warm_state(model_config, params, gen, task, setting, seed):
  """(TrainState, optimizer, the jitted GRPO update) after ``setting.warm_steps`` RL steps of
  GRPO from ``params`` (prompts of the task's train split drawn with ``seed``)."""
  optim = _optim(setting)
  total = setting.schedule_steps * setting.minibatches
  optimizer = update.make_optimizer(optim, total)
  state = update.TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params))
  hp = objectives.default_hparams('grpo')
  step_fn = jax.jit(lambda s, mb: update.update_step(
      s, jax.tree.map(lambda x: None if x is None else x[
          None], mb), model_config=model_config, optimizer=optimizer, loss_name='grpo', loss_hparams
      =hp, completion_start=setting.prompt_width, group_size=setting.group_size))
  for k in range(setting.warm_steps):
    batch, _ = sample_batch(gen, state.params, _examples(task, setting, seed, k),
                            jax.random.key(1000 * seed + k), setting)
    for mb in minibatches(batch, setting, jax.random.key(2000 * seed + k)):
      state, _ = step_fn(state, mb)
  return state, optimizer, step_fn


def _examples(task, setting, seed, k):
  return task.examples('train', seed=10_000 * seed + k, num_examples=setting.prompts)


def measure(logps_fn, params, opt_state, mb, *, loss_name, group_size, optimizer, optim,
            learning_rate, loss_hparams=None, preconditioning='adam', with_coupling=True):
  """One objective's update of mini-batch ``mb`` from (``params``, ``opt_state``), measured.

  The update is the trainer's (its gradient is that of `update.update_step`'s loss with the
  entropy bonus off: sum_j c_j grad log pi_j; 'adam': the optimiser's step, 'sgd': -lr g). Returns
  a dict: 'coef', 'exact' (re-scored change), 'after' (params), 'opt_state', 'flip'
  (`flipping.shares`), 'mass' (`gradient_mass.gradient_mass`), 'loss_metrics', and with
  ``with_coupling`` 'coupling' (`coupling.decompose`) and 'summary' (`coupling.summarize`)."""
  hp = dict(objectives.default_hparams(loss_name), **(loss_hparams or {}))
  hp['entropy_coef'] = 0.0
  if preconditioning not in ('adam', 'sgd'):
    raise ValueError(f"preconditioning={preconditioning!r}; valid: 'adam', 'sgd'")
  coef_fn = jax.jit(lambda lp, old, adv, mask: diagnostics.loss_coefficients(
      lp, loss_name=loss_name, old_logps=old, advantages=adv, mask=mask, group_size=group_size, **hp
  ))
  scored = jax.jit(logps_fn)
  coef_BT, metrics = coef_fn(scored(params), mb.old_logps_BT, mb.advantages_B, mb.mask_BT)
  grads, = jax.jit(lambda p, c: jax.vjp(logps_fn, p)[1](c))(params, coef_BT)
  if preconditioning == 'adam':
    updates, new_opt = jax.jit(optimizer.update)(grads, opt_state, params)
    d, mu, _ = jax.jit(functools.partial(coupling.adam_parts,
                                         optim=optim))(grads, opt_state, params,
                                                       learning_rate=learning_rate)
  else:
    updates, new_opt = jax.tree.map(lambda g: -learning_rate * g, grads), opt_state
    d, mu, _ = coupling.sgd_parts(params, learning_rate=learning_rate)
  after = optax.apply_updates(params, updates)
  exact = flipping.rescore(scored, params, after)
  out = {
      'coef': coef_BT,
      'exact': exact,
      'after': after,
      'opt_state': new_opt,
      'loss_metrics': {
          k: float(v) for k, v in metrics.items()
      },
      'flip': flipping.shares(exact, mb.mask_BT, mb.advantages_B),
      'mass': {
          k: float(v) for k, v in gradient_mass.gradient_mass(coef_BT, mb.mask_BT, mb.advantages_B,
                                                             group_size=group_size).items()
      },
  }
  if with_coupling:
    ids_BT = mb.tokens_BL[:, -mb.mask_BT.shape[1]:]
    parts = coupling.decompose(logps_fn, params, coef_BT, mb.mask_BT, ids_BT, d=d, mu=mu)
    contested = coupling.contested_mask(ids_BT, mb.mask_BT, mb.advantages_B, group_size=group_size)
    out['coupling'] = parts
    out['summary'] = coupling.summarize(parts, mb.mask_BT, contested_BT=contested, exact_BT=exact)
  return out


def probe(model_config, params, gen, task, setting, seed,
          objectives_=('grpo', 'gspo', 'dfpo_min_replace')):
  """The step after ``warm_state``: its first mini-batch updated with GRPO, then the second
  mini-batch updated from the same parameters and Adam state by each of ``objectives_``.
  Returns {'batch': the second mini-batch, 'rewards', name: `measure`'s dict}."""
  state, optimizer, step_fn = warm_state(model_config, params, gen, task, setting, seed)
  k = setting.warm_steps
  batch, rewards = sample_batch(gen, state.params, _examples(task, setting, seed, k),
                                jax.random.key(1000 * seed + k), setting)
  mb1, mb2 = minibatches(batch, setting, jax.random.key(2000 * seed + k))[:2]
  state, _ = step_fn(state, mb1)
  optim = _optim(setting)
  schedule = update.learning_rate_schedule(optim, setting.schedule_steps * setting.minibatches)
  lr = float(schedule(int(state.step)))
  fn = coupling.policy_logps_fn(model_config, mb2.tokens_BL, mb2.input_mask_BL,
                                completion_start=setting.prompt_width)
  out = {'batch': mb2, 'rewards': rewards}
  for name in objectives_:
    out[name] = measure(fn, state.params, state.opt_state, mb2, loss_name=name,
                        group_size=setting.group_size, optimizer=optimizer, optim=optim,
                        learning_rate=lr)
  return out
