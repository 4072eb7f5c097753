"""Tests of jtc.analysis.flipping, with the linear softmax policy of test_coupling: the negative
control (lone rollouts move with their advantage's sign: nothing flips) and the known positive
(a token shared with a rollout of the opposite sign and a larger coefficient flips)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import flipping
from tests.analysis.test_coupling import softmax_logps_fn


def _step(h_UD, y_U, c_U, lr=0.05):
  params = {'w': jax.random.normal(jax.random.key(0), (7, 4))}
  fn = softmax_logps_fn(jnp.asarray(h_UD, jnp.float32)[:, None, :], jnp.asarray(y_U)[:, None])
  grads = jax.vjp(fn, params)[1](jnp.asarray(c_U, jnp.float32)[:, None])[0]
  after = jax.tree.map(lambda p, g: p - lr * g, params, grads)
  return flipping.rescore(fn, params, after)


def test_lone_rollouts_move_with_their_sign_and_nothing_flips():
  """Orthogonal contexts: each token only has its own term; advantage > 0 (c < 0) boosts it."""
  delta = _step(np.eye(4)[:4], [1, 2, 3, 4], [-1.0, -0.5, 1.0, 0.5])
  s = flipping.shares(delta, jnp.ones((4, 1)), jnp.array([1.0, 0.5, -1.0, -0.5]))
  assert (s['boosted_pos'], s['suppressed_neg'], s['flipped'], s['boosted_gap']) == (1, 1, 0, 1)


def test_a_token_shared_with_a_stronger_opposite_rollout_flips():
  """Rows 0 (positive, c = -0.5) and 1 (negative, c = +1) hold the same token in the same
  context: the net push is down, so the positive rollout's token is suppressed (flipped)."""
  h = np.array([[1.0, 0.5, -0.3, 0.2]] * 2 + [[0.0, 0.0, 0.0, 1.0]])
  delta = _step(h, [2, 2, 5], [-0.5, 1.0, -1.0])
  adv = jnp.array([0.5, -1.0, 1.0])
  s = flipping.shares(delta, jnp.ones((3, 1)), adv)
  assert float(delta[0, 0]) < 0 and s['suppressed_pos'] == pytest.approx(0.5)
  assert s['flipped'] == pytest.approx(1 / 3) and s['boosted_neg'] == 0.0
  cls = flipping.classify(delta, jnp.ones((3, 1)))
  np.testing.assert_array_equal(np.asarray(cls)[:, 0], [-1, -1, 1])


def test_padding_and_zero_advantage_rows_are_left_out():
  delta = jnp.array([[0.1, -0.2], [0.3, 5.0], [-1.0, 0.0]])
  mask = jnp.array([[1, 1], [1, 0], [1, 1]])
  s = flipping.shares(delta, mask, jnp.array([1.0, 0.0, -1.0]))
  assert (s['tokens_pos'], s['tokens_neg']) == (2, 2)
  assert s['boosted_pos'] == 0.5 and s['suppressed_neg'] == 0.5  # 0.0 is unchanged
  assert np.isnan(flipping.shares(delta, mask, jnp.zeros(3))['boosted_pos'])
