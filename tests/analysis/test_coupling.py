"""Tests of jtc.analysis.coupling: the known answer (two identical tokens with opposite
coefficients cancel, a distinct one couples by its closed-form inner product), the negative
control (orthogonal contexts: no coupling), the first-order sum against the exact change, the
explicit Gram matrix against the VJP/JVP decomposition on the tiny transformer, and the AdamW
parts against optax's update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from jtc.analysis import coupling
from jtc.analysis import flipping
from jtc.models import model
from jtc.rl import update

V, D = 7, 4


def softmax_logps_fn(h_BTD, y_BT):
  """A linear softmax policy log pi(y | h) = log softmax(W h)_y, params {'w': [V, D]}: grad_W
  log pi = (e_y - p) h^T, so g_i . g_j = (e_yi - p_i) . (e_yj - p_j) (h_i . h_j)."""

  def fn(params):
    logits_BTV = jnp.einsum('BTD,VD->BTV', h_BTD, params['w'])
    lp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    return jnp.take_along_axis(lp_BTV, y_BT[..., None], axis=-1)[..., 0]

  return fn


def _closed_gram(params, h_UD, y_U):
  p_UV = jax.nn.softmax(h_UD @ params['w'].T, axis=-1)
  e_UV = jax.nn.one_hot(y_U, V) - p_UV
  return (e_UV @ e_UV.T) * (h_UD @ h_UD.T)


def _toy(h_UD, y_U):
  params = {'w': jax.random.normal(jax.random.key(0), (V, D))}
  h_BTD = jnp.asarray(h_UD, jnp.float32)[:, None, :]
  y_BT = jnp.asarray(y_U)[:, None]
  return params, softmax_logps_fn(h_BTD, y_BT), y_BT


def test_two_identical_tokens_with_opposite_coefficients_cancel_and_a_third_couples_in_closed_form(
):
  h = np.array([[1.0, 0.5, -0.3, 0.2]] * 3)
  y = np.array([2, 2, 5])  # tokens 0 and 1 identical (context and id), token 2 another id
  params, fn, y_BT = _toy(h, y)
  c_BT = jnp.array([[-1.0], [1.0], [0.5]])
  lr = 1e-3
  d, mu, _ = coupling.sgd_parts(params, learning_rate=lr)
  parts = coupling.decompose(fn, params, c_BT, jnp.ones((3, 1)), y_BT, d=d, mu=mu)
  k = _closed_gram(params, jnp.asarray(h, jnp.float32), jnp.asarray(y))
  np.testing.assert_allclose(parts['own'][:, 0], -lr * np.asarray(c_BT[:, 0]) * np.diag(k),
                             rtol=1e-5)
  # Token 0's identical twin cancels its own term exactly; token 2 is another id.
  np.testing.assert_allclose(parts['same'][0, 0], -parts['own'][0, 0], rtol=1e-5)
  np.testing.assert_allclose(parts['other'][0, 0], -lr * 0.5 * k[0, 2], rtol=1e-5)
  np.testing.assert_allclose(parts['other'][2, 0], -lr * (-1.0 * k[2, 0] + 1.0 * k[2, 1]),
                             atol=1e-9)
  assert abs(float(parts['same'][2, 0])) < 1e-9  # no other token has id 5
  np.testing.assert_allclose(np.asarray(parts['same_by_conf']).sum(0), parts['same'], atol=1e-9)
  gram, _ = coupling.gram(fn, params, jnp.ones((3, 1)), d=d)
  np.testing.assert_allclose(gram, lr * k, rtol=1e-5)
  s = coupling.summarize(parts, jnp.ones((3, 1)), contested_BT=np.array([[1], [1], [0]], bool))
  assert s['contested_residual'] == pytest.approx(0.0, abs=1e-6)


def test_orthogonal_contexts_do_not_couple_and_first_order_matches_the_exact_change():
  """The negative control: contexts h_i mutually orthogonal make every g_i . g_j = 0 (i != j),
  so each token's change is its own term alone; it matches the exact re-scored change to first
  order (the error shrinks with the step)."""
  h = np.eye(D)[:3]
  y = np.array([2, 2, 5])  # even the same id does not couple across orthogonal contexts
  params, fn, y_BT = _toy(h, y)
  c_BT = jnp.array([[-1.0], [1.0], [0.5]])
  errors = []
  for lr in (1e-1, 1e-2):
    d, mu, _ = coupling.sgd_parts(params, learning_rate=lr)
    parts = coupling.decompose(fn, params, c_BT, jnp.ones((3, 1)), y_BT, d=d, mu=mu)
    tol = 1e-6 * float(jnp.max(jnp.abs(parts['own'])))  # float32 rounding of a zero sum
    np.testing.assert_allclose(parts['same'], 0.0, atol=tol)
    np.testing.assert_allclose(parts['other'], 0.0, atol=tol)
    grads = jax.vjp(fn, params)[1](c_BT)[0]
    after = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    exact = flipping.rescore(fn, params, after)
    s = coupling.summarize(parts, jnp.ones((3, 1)), exact_BT=exact)
    assert s['first_order_sign_agreement'] == 1.0
    errors.append(s['first_order_rel_error'])
  assert errors[1] < 0.2 * errors[0] and errors[1] < 1e-3  # the second-order rest ~ lr


@pytest.fixture(scope='module')
def tiny():  # pylint: disable=missing-function-docstring
  cfg = model.ModelConfig.tiny(vocab_size=12, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                               head_dim=8, d_ff=32)
  params = model.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  p, t, b = 2, 4, 4
  tokens = np.concatenate([np.tile([1, 2], (b, 1)), rng.integers(3, 7, size=(b, t))], 1)
  tokens[1, p:] = tokens[0, p:]  # rows 0 and 1 identical: identical tokens in equal contexts
  tokens, inm = jnp.asarray(tokens, jnp.int32), jnp.ones((b, p + t), jnp.int32)
  fn = coupling.policy_logps_fn(cfg, tokens, inm, completion_start=p)
  mask = jnp.asarray(np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]),
                     jnp.float32)
  return cfg, params, fn, tokens[:, p:], mask


@pytest.mark.slow  # the transformer's Jacobians compile for ~10 s on the 2-core machine
def test_the_decomposition_sums_the_explicit_gram_matrix_on_the_transformer(tiny):
  """On the tiny transformer with AdamW's preconditioning: own / same / other (and their
  confidence bins) equal the sums of the explicit D-weighted Gram matrix over the same sets."""
  cfg, params, fn, ids_BT, mask_BT = tiny
  del cfg
  rng = np.random.default_rng(1)
  coef_BT = jnp.asarray(rng.normal(size=ids_BT.shape), jnp.float32) * mask_BT
  optim = common.get_config().optim
  optimizer = update.make_optimizer(optim, 10)
  opt_state = optimizer.init(params)
  grads = jax.vjp(fn, params)[1](coef_BT)[0]
  d, mu, _ = coupling.adam_parts(grads, opt_state, params, optim=optim, learning_rate=1e-3)
  parts = coupling.decompose(fn, params, coef_BT, mask_BT, ids_BT, d=d, mu=mu)
  _check_against_gram(fn, params, coef_BT, mask_BT, ids_BT, d, parts)


@pytest.mark.slow
def test_the_decomposition_sums_the_explicit_gram_matrix_of_a_two_leaf_policy():
  """[B, T] = [3, 2] rows of a policy with two parameter leaves (W and a bias) under AdamW's
  preconditioning: own / same / other equal the sums of the explicit Gram matrix."""
  h_BTD = jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, D)), jnp.float32)
  y_BT = jnp.array([[2, 3], [2, 2], [5, 3]])

  def fn(params):  # a biased linear softmax: two leaves, both with a gradient
    logits_BTV = jnp.einsum('BTD,VD->BTV', h_BTD, params['w']) + params['b']
    lp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    return jnp.take_along_axis(lp_BTV, y_BT[..., None], axis=-1)[..., 0]

  params = {'w': jax.random.normal(jax.random.key(0), (V, D)), 'b': jnp.linspace(-1, 1, V)}
  coef_BT = jnp.array([[-1.0, 0.5], [1.0, -0.25], [0.5, 2.0]])
  mask_BT = jnp.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
  optim = common.get_config().optim
  opt_state = update.make_optimizer(optim, 10).init(params)
  grads = jax.vjp(fn, params)[1](coef_BT * mask_BT)[0]
  d, mu, _ = coupling.adam_parts(grads, opt_state, params, optim=optim, learning_rate=1e-3)
  parts = coupling.decompose(fn, params, coef_BT * mask_BT, mask_BT, y_BT, d=d, mu=mu)
  _check_against_gram(fn, params, coef_BT * mask_BT, mask_BT, y_BT, d, parts)


def _check_against_gram(fn, params, coef_BT, mask_BT, ids_BT, d, parts):
  gram, flat = coupling.gram(fn, params, mask_BT, d=d)
  k = np.asarray(gram, np.float64)
  c, ids = np.asarray(coef_BT).reshape(-1)[flat], np.asarray(ids_BT).reshape(-1)[flat]
  bins = np.asarray(parts['conf_bin']).reshape(-1)[flat]
  same = ids[:, None] == ids[None, :]
  np.fill_diagonal(same, False)
  other = ids[:, None] != ids[None, :]
  get = lambda key: np.asarray(parts[key]).reshape(-1)[flat]
  scale = np.abs(k).max() * np.abs(c).max()
  np.testing.assert_allclose(get('own'), -c * np.diag(k), atol=1e-5 * scale)
  np.testing.assert_allclose(get('same'), -(k * same) @ c, atol=1e-5 * scale)
  np.testing.assert_allclose(get('other'), -(k * other) @ c, atol=1e-5 * scale)
  for b in range(len(coupling.CONF_EDGES) + 1):
    by = lambda key, b=b: np.asarray(parts[key])[b].reshape(-1)[flat]
    np.testing.assert_allclose(by('same_by_conf'), -(k * same * (bins == b)[None]) @ c,
                               atol=1e-5 * scale)
    np.testing.assert_allclose(by('other_by_conf'), -(k * other * (bins == b)[None]) @ c,
                               atol=1e-5 * scale)
  assert np.all(np.asarray(parts['own'])[np.asarray(mask_BT) == 0] == 0)


def test_adam_parts_are_the_update_optax_takes():
  optim = common.get_config().optim
  optim.weight_decay, optim.grad_clip = 0.01, 0.5
  params = {'a': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(4)}
  optimizer = update.make_optimizer(optim, 20)
  state = optimizer.init(params)
  schedule = update.learning_rate_schedule(optim, 20)
  rng = np.random.default_rng(0)
  for step in range(3):  # a non-trivial momentum; the clip active (norm > 0.5)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    d, mu, s = coupling.adam_parts(grads, state, params, optim=optim,
                                   learning_rate=float(schedule(step)))
    updates, state = optimizer.update(grads, state, params)
    predicted = jax.tree.map(lambda dd, g, m: -dd * g + m, d, grads, mu)
    for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(predicted)):
      np.testing.assert_allclose(p, u, rtol=1e-5, atol=1e-9)
    assert float(s) < 1.0
    params = jax.tree.map(jnp.add, params, updates)


def test_contested_tokens_are_ids_in_a_positive_and_a_negative_rollout_of_the_group():
  ids = np.array([[3, 4, 5], [3, 6, 6], [4, 7, 7], [3, 5, 9]])
  mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
  adv = np.array([1.0, -1.0, 0.5, -0.5])
  got = coupling.contested_mask(ids, mask, adv, group_size=2)
  # Group 0: 3 is in both rows (6 only in the negative one, masked at t=2 anyway).
  np.testing.assert_array_equal(got[:2], [[1, 0, 0], [1, 0, 0]])
  # Group 1: no id in common between its positive and negative row.
  assert not got[2:].any()
