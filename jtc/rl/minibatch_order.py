"""Which rollouts share a mini-batch (`config.optim.minibatch_order`): the batching interventions
of the Cancellation Hypothesis (Cheng et al. 2026, arXiv 2605.08666) and their negation.

  group            whole groups per mini-batch (a fresh permutation of the groups per epoch):
                   a prompt's rollouts are updated together ("query-preserved mini-batching").
                   jtc's default and its behaviour before the key existed.
  shuffled         a fresh permutation of the rollouts (rows) per epoch, cut into mini-batches of
                   the same size: a group's rollouts are spread over the mini-batches, as peers
                   that shuffle rows do. Its advantages are still the group's (computed on the
                   whole rollout batch); only the updates that see them change.
  reward_balanced  rows dealt so that every mini-batch holds as many positive-, negative- and
                   zero-advantage rollouts as an even split allows (counts differ by at most one):
                   jtc's reading of the paper's "reward-balanced batching", whose exact recipe
                   (rows or whole groups) was not available to check.

The order only matters with more than one mini-batch per step (one mini-batch sums every row
whatever the order): other orders than 'group' are refused there. Losses whose per-row
objective depends on the other rows of its group (DFPO's in-group transform, `GROUP_LOSSES`) are
refused too: split groups would be transformed as if they were groups. With a row order the
loss metrics that read groups (asym, frac_degenerate_groups) read G consecutive rows of the
mini-batch, which are no group, and the step diagnostics (whole-group cancellation) are refused.

Dimension key (docs/dimensions.md): B rows (= M * G), M groups, G group size; n mini-batches of
B / n rows each (`[n, B / n]`).
"""

import jax
import numpy as np

from jtc.rl import sharding as sharding_lib

ORDERS = ('group', 'shuffled', 'reward_balanced')
# Losses whose objective couples the rows of a group (tests/rl/test_minibatch_order.py checks
# that every other registered loss gives each row the same coefficients whatever rows share its
# mini-batch, and that these do not).
GROUP_LOSSES = frozenset({'dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj'})


def check_config(c):
  """ValueError naming the key for an order that is unknown or meaningless with this config."""
  order = c.optim.minibatch_order
  if order not in ORDERS:
    raise ValueError(f'config.optim.minibatch_order={order!r}; valid: {", ".join(ORDERS)}')
  if order == 'group':
    return
  if c.rollout.prompts_per_step // c.optim.minibatch_prompts < 2:
    raise ValueError(
        f'config.optim.minibatch_order={order!r} needs more than one mini-batch per step '
        f'(config.rollout.prompts_per_step={c.rollout.prompts_per_step}, '
        f'config.optim.minibatch_prompts={c.optim.minibatch_prompts}): one mini-batch holds '
        "every rollout whatever the order; use 'group'")
  if c.loss.name in GROUP_LOSSES:
    raise ValueError(f'config.optim.minibatch_order={order!r} with config.loss.name='
                     f'{c.loss.name!r}: its in-group transform needs whole groups in a '
                     f"mini-batch; use 'group' (row orders suit {_row_losses_text()})")
  if c.token_weights and c.delta.scope == 'group':
    raise ValueError(f"config.optim.minibatch_order={order!r} with config.delta.scope='group': "
                     "DelTA's group scope needs whole groups; use scope 'batch' or order 'group'")
  if c.log.diagnostics_every:
    raise ValueError(f'config.optim.minibatch_order={order!r} with config.log.diagnostics_every='
                     f'{c.log.diagnostics_every}: the step diagnostics measure whole-group '
                     'cancellation and need whole groups; set it to 0')


def _row_losses_text():
  from jtc import objectives  # pylint: disable=import-outside-toplevel
  return ', '.join(sorted(set(objectives.LOSSES) - GROUP_LOSSES))


def epoch_rows(order, rng, *, num_groups, group_size, num_minibatches, adv_B=None):
  """[n, B / n] int64: the rows of each mini-batch of one epoch.

  Args:
    order: one of ORDERS.
    rng: a jax key, the epoch's own (fold_in(member key, epoch)), so every epoch draws afresh;
      'group' draws exactly the permutation of the groups jtc drew before the key existed.
    num_groups, group_size: M and G (B = M * G rows, groups contiguous).
    num_minibatches: n, dividing M.
    adv_B: [B] advantages, needed by 'reward_balanced'.
  """
  b = num_groups * group_size
  if num_groups % num_minibatches:
    raise ValueError(f'num_minibatches={num_minibatches} does not divide num_groups={num_groups}')
  if order == 'group':
    groups_M = np.asarray(jax.random.permutation(rng, num_groups))
    rows_B = (groups_M[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
    return rows_B.reshape(num_minibatches, -1)
  if order == 'shuffled':
    return np.asarray(jax.random.permutation(rng, b)).reshape(num_minibatches, -1)
  if order == 'reward_balanced':
    if adv_B is None or np.shape(adv_B) != (b,):
      raise ValueError(f"'reward_balanced' needs the [B={b}] advantages, got "
                       f'{None if adv_B is None else np.shape(adv_B)}')
    return balanced_rows(np.asarray(adv_B), rng, num_minibatches=num_minibatches)
  raise ValueError(f'minibatch order {order!r}; valid: {", ".join(ORDERS)}')


def members_rows(order, keys, epoch, batch, population, *, num_groups, group_size, num_minibatches):
  """`epoch_rows` of every member of ``population`` (its keys ``keys``, folded with ``epoch``);
  'reward_balanced' reads the members' advantages from ``batch`` (an `update.Batch`)."""
  adv = [None] * population.n
  if order == 'reward_balanced':
    adv = population.unstack(np.asarray(sharding_lib.to_host(batch.advantages_B)))
  return [
      epoch_rows(order, jax.random.fold_in(k, epoch), num_groups=num_groups, group_size=group_size,
                 num_minibatches=num_minibatches, adv_B=a) for k, a in zip(keys, adv)
  ]


def balanced_rows(adv_B, rng, *, num_minibatches):
  """'reward_balanced': the rows in a random order within each sign class (positive, negative,
  zero advantage), the classes one after the other, dealt round-robin to the n mini-batches, so
  that each gets B / n rows and every class splits as evenly as it can. [n, B / n]."""
  sign_B = np.sign(adv_B)
  perm_B = np.asarray(jax.random.permutation(rng, adv_B.shape[0]))
  # Stable sort of a random order by class: random within a class, positives first.
  rows_B = perm_B[np.argsort(-sign_B[perm_B] + 2 * (sign_B[perm_B] == 0), kind='stable')]
  return np.stack([rows_B[k::num_minibatches] for k in range(num_minibatches)])
