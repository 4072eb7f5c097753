"""Tests of jtc.rl.minibatch_order: 'group' draws exactly the mini-batches jtc drew before the key
existed, 'shuffled' and 'reward_balanced' cover every row once per epoch (the latter with every
advantage sign split evenly), run_updates follows the order, meaningless settings are refused,
and GROUP_LOSSES is exactly the set of losses whose rows depend on their group."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo as grpo_config
from jtc import objectives
from jtc.rl import config_check
from jtc.rl import minibatch_order
from jtc.rl import population as population_lib
from jtc.rl import update

M, G, N = 8, 4, 2


def test_group_order_is_the_permutation_of_groups_drawn_before():
  key = jax.random.fold_in(jax.random.key(3), 1)
  rows = minibatch_order.epoch_rows('group', key, num_groups=M, group_size=G, num_minibatches=N)
  order_M = np.asarray(jax.random.permutation(key, M))
  for i in range(N):
    np.testing.assert_array_equal(rows[i], update.minibatch_rows(order_M, i * M // N, M // N, G))


def test_row_orders_cover_every_row_once_and_split_groups():
  key = jax.random.key(0)
  adv_B = np.repeat(np.array([1.0, -1.0, 0.0, 0.5, -0.5, 2.0, 0.0, -3.0]), G)
  adv_B[::3] *= -1
  for order in ('shuffled', 'reward_balanced'):
    rows = minibatch_order.epoch_rows(order, key, num_groups=M, group_size=G, num_minibatches=N,
                                      adv_B=adv_B)
    assert rows.shape == (N, M * G // N)
    np.testing.assert_array_equal(np.sort(rows.reshape(-1)), np.arange(M * G))
    groups_per_mb = [set(r // G) for r in rows]
    assert any(groups_per_mb[0] & s for s in groups_per_mb[1:])  # some group is split
  rows = minibatch_order.epoch_rows('reward_balanced', key, num_groups=M, group_size=G,
                                    num_minibatches=N, adv_B=adv_B)
  for sign in (1, -1, 0):
    counts = [int(np.sum(np.sign(adv_B[r]) == sign)) for r in rows]
    assert max(counts) - min(counts) <= 1, (sign, counts)
  # A group order is balanced only by chance: this draw puts more positives in one mini-batch.
  rows = minibatch_order.epoch_rows('group', key, num_groups=M, group_size=G, num_minibatches=N)
  counts = [int(np.sum(adv_B[r] > 0)) for r in rows]
  assert max(counts) - min(counts) > 1
  with pytest.raises(ValueError, match=r"'reward_balanced' needs the \[B=32\] advantages"):
    minibatch_order.epoch_rows('reward_balanced', key, num_groups=M, group_size=G,
                               num_minibatches=N)


def test_run_updates_takes_the_rows_of_the_order():
  """run_updates with a recording minibatch_fn: every epoch updates every row once, in
  mini-batches balanced by sign."""
  adv_B = jnp.asarray(np.random.default_rng(0).choice([-1.0, 0.0, 1.0], M * G))
  seen = []

  def minibatch_fn(batch, rows):
    seen.append(np.asarray(rows))
    return rows

  _, out = update.run_updates(
      None,
      update.Batch(tokens_BL=None,
                   input_mask_BL=None, mask_BT=None, advantages_B=adv_B, old_logps_BT=None),
      jax.random.key(0), update_fn=lambda s, mb, h: (s, {
          'loss': jnp.float32(0.0)
      }), minibatch_fn=minibatch_fn, num_groups=M, minibatch_prompts=M // N, ppo_epochs=2,
      group_size=G, population=population_lib.SINGLE, minibatch_order='reward_balanced')
  assert len(seen) == 2 * N and out[0]['loss'] == 0.0
  for epoch in range(2):
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[epoch * N:(epoch + 1) * N])),
                                  np.arange(M * G))
  for rows in seen:
    assert abs(int(np.sum(np.asarray(adv_B)[rows] > 0)) - int(np.sum(adv_B > 0)) / N) <= 1


def _config(**overrides):
  c = grpo_config.get_config('smoke')
  c.rollout.prompts_per_step, c.optim.minibatch_prompts, c.log.diagnostics_every = 4, 2, 0
  for key, value in overrides.items():
    section, leaf = key.rsplit('.', 1)
    c[section][leaf] = value
  return c


@pytest.mark.parametrize('overrides, needle', [
    ({
        'optim.minibatch_order': 'random'
    }, "minibatch_order='random'; valid: group, shuffled"),
    ({
        'optim.minibatch_prompts': 4
    }, 'needs more than one mini-batch per step'),
    ({
        'loss.name': 'dfpo_min_replace'
    }, 'in-group transform needs whole groups'),
    ({
        'log.diagnostics_every': 5
    }, 'diagnostics_every=5: the step diagnostics'),
])
def test_meaningless_orders_are_refused_naming_the_key(overrides, needle):
  c = _config(**{'optim.minibatch_order': 'shuffled', **overrides})
  if c.loss.name == 'dfpo_min_replace':
    c = _config(**{'optim.minibatch_order': 'shuffled'})
    from configs import dfpo_min_replace  # pylint: disable=import-outside-toplevel
    c.loss = dfpo_min_replace.get_config('smoke').loss
  with pytest.raises(ValueError, match=needle):
    config_check.validate(c)
  config_check.validate(_config(**{'optim.minibatch_order': 'reward_balanced'}))


def _coefficients_fn(name, group_size):
  hp = objectives.default_hparams(name)
  return jax.jit(
      jax.grad(lambda lp, old, adv, mask: objectives.compute_loss(
          name, logps=lp, old_logps=old, advantages=adv, mask=mask, group_size=group_size, **hp)[0])
  )


def test_group_losses_are_exactly_those_whose_rows_depend_on_their_group():
  """Each registered loss on an off-policy batch, then on the same rows with two rows of
  different groups swapped: a row-separable loss gives every row the same coefficients
  (followed by the swap), a GROUP_LOSSES one does not."""
  b, t = 8, 5
  keys = jax.random.split(jax.random.key(2), 4)
  logps_BT = -1.0 - jax.random.uniform(keys[0], (b, t))
  inp = dict(old_logps=logps_BT + 0.3 * jax.random.normal(keys[1], (b, t)),
             advantages=jax.random.normal(keys[2], (b,)), mask=jnp.ones((b, t)), group_size=4)
  perm = np.arange(b)
  perm[[1, 6]] = perm[[6, 1]]
  swapped = {k: (v[perm] if k != 'group_size' else v) for k, v in inp.items()}
  for name, spec in objectives.LOSSES.items():
    if spec.token_weighted:
      continue  # DelTA: refused by its own scope check
    fn = _coefficients_fn(name, 4)
    a = fn(logps_BT, inp['old_logps'], inp['advantages'], inp['mask'])
    s = fn(logps_BT[perm], swapped['old_logps'], swapped['advantages'], swapped['mask'])
    same = np.allclose(np.asarray(a)[perm], np.asarray(s), atol=1e-7)
    assert same == (name not in minibatch_order.GROUP_LOSSES), name
