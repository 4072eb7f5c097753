"""Tests of jtc.objectives.group_transforms against the paper's identities and brute-force references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.objectives import group_transforms as gt
from tests.objectives import loss_reference

_QP = jax.jit(gt.pos_orth_proj_qp)
_TR = jax.jit(gt.pos_orth_proj_truncate_rebalance, static_argnames='trunc_eps')
_ORTH = jax.jit(gt.orth_proj)
_MIN = jax.jit(gt.min_replace)


def _random_group(rng, g, *, centred=True, spread=0.5):
  """Post-clip-like weights (positive, some far from 1) and advantages."""
  w = np.exp(rng.normal(0.0, spread, g)).astype(np.float32)
  a = rng.normal(size=g).astype(np.float32)
  if centred:
    a = a - a.mean()
  return w, a.astype(np.float32)


def qp_bruteforce(w, a):
  """Eq. 51 by enumerating supports (tests/objectives/loss_reference.py), in float64."""
  return loss_reference.np_qp(np.asarray(w, np.float64), np.asarray(a, np.float64))


def truncate_rebalance_loops(w, a, eps):
  s = [max(float(x), eps) for x in w]
  p = sum(a[i] * s[i] for i in range(len(s)) if a[i] > 0)
  n = sum(-a[i] * s[i] for i in range(len(s)) if a[i] < 0)
  out = list(s)
  for i in range(len(s)):
    if p - n > 0 and a[i] > 0:
      out[i] = s[i] * n / p
    if p - n < 0 and a[i] < 0:
      out[i] = s[i] * p / n
  return np.array(out)


def test_eq49_post_clip_rewrite_is_exact():
  rng = np.random.default_rng(0)
  s = np.exp(rng.normal(0, 0.3, 200)).astype(np.float32)
  a = rng.normal(size=200).astype(np.float32)
  a[:10] = 0.0
  for lo, hi in [(0.2, 0.2), (0.1, 0.3), (3e-4, 4e-4)]:
    lhs = gt.clipped_objective(jnp.asarray(s), jnp.asarray(a), eps_low=lo, eps_high=hi)
    s_bar = gt.post_clip_weight(jnp.asarray(s), jnp.asarray(a), eps_low=lo, eps_high=hi)
    np.testing.assert_allclose(lhs, a * np.asarray(s_bar), rtol=1e-6, atol=1e-7)
    # Eq. 47 by cases, written independently.
    c = np.clip(s, 1 - lo, 1 + hi)
    np.testing.assert_allclose(s_bar, np.where(a >= 0, np.minimum(s, c), np.maximum(s, c)))


def test_theorem_c1_min_replace_only_shrinks():
  rng = np.random.default_rng(1)
  for _ in range(50):
    w, a = _random_group(rng, 6)
    w_t = np.asarray(_MIN(w, a))
    phi = w_t / w
    assert np.all(phi > 0) and np.all(phi <= 1 + 1e-7)
    np.testing.assert_array_equal(np.sign(w_t * a), np.sign(w * a))  # no reverse update (Eq. 62)
    assert np.all(np.abs(w_t * a) <= np.abs(w * a) + 1e-7)
    np.testing.assert_allclose(np.sum(w_t * a), 0.0, atol=1e-5)


@pytest.mark.parametrize('name',
                         ['orth_proj', 'pos_orth_proj_qp', 'pos_orth_proj_truncate_rebalance'])
def test_orth_variants_are_orthogonal(name):
  rng = np.random.default_rng(2)
  kwargs = {'trunc_eps': 1e-3} if name.endswith('rebalance') else {}
  w_MG = np.exp(rng.normal(0, 0.5, (64, 8))).astype(np.float32)
  a_MG = rng.normal(size=(64, 8)).astype(np.float32)
  a_MG -= a_MG.mean(-1, keepdims=True)
  v_MG = np.asarray(gt.apply_to_groups(name, jnp.asarray(w_MG), jnp.asarray(a_MG), **kwargs))
  np.testing.assert_allclose(np.sum(v_MG * a_MG, -1), 0.0, atol=2e-5)


def test_orth_proj_is_euclidean_projection():
  rng = np.random.default_rng(3)
  w, a = _random_group(rng, 7)
  v = np.asarray(_ORTH(w, a))
  d = w - v  # removed component is parallel to A
  np.testing.assert_allclose(d, a * (np.dot(a, w) / np.dot(a, a)), rtol=1e-5, atol=1e-6)


def test_qp_kkt_and_bruteforce():
  rng = np.random.default_rng(4)
  n_binding = 0
  for trial in range(60):
    g = [2, 3, 4, 5, 8][trial % 5]
    w, a = _random_group(rng, g, spread=1.0)
    if trial % 3 == 0:  # a few strongly skewed groups so non-negativity binds
      a = a * 3.0
    v = np.asarray(_QP(w, a), np.float64)
    ref = qp_bruteforce(w, a)
    np.testing.assert_allclose(v, ref, rtol=1e-4, atol=1e-5)
    # KKT: primal feasibility, v = max(w - lam a, 0) with one multiplier lam, dual feasibility.
    assert np.all(v >= 0)
    assert abs(np.dot(a, v)) < 1e-4
    act = v > 1e-6
    lam = np.sum(a[act] * (w[act] - v[act])) / max(np.sum(a[act]**2), 1e-30)
    np.testing.assert_allclose(v[act], (w - lam * a)[act], rtol=1e-4, atol=1e-5)
    assert np.all(w[~act] - lam * a[~act] <= 1e-4)  # mu_i = lam a_i - w_i >= 0
    n_binding += int(np.any(~act))
    # Optimality against the plain projection when that is already non-negative.
    orth = np.asarray(_ORTH(w, a))
    if np.all(orth >= 0):
      np.testing.assert_allclose(v, orth, rtol=1e-4, atol=1e-5)
  assert n_binding >= 5  # the test exercised the non-negativity constraint


def test_truncate_rebalance_properties():
  rng = np.random.default_rng(5)
  eps = 1e-3
  for trial in range(60):
    g = [2, 4, 8][trial % 3]
    w, a = _random_group(rng, g)
    if trial % 4 == 0:
      w[0] = 0.0  # a zero weight gets truncated up to eps
    v = np.asarray(_TR(w, a, trunc_eps=eps))
    np.testing.assert_allclose(v, truncate_rebalance_loops(w, a, eps), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.dot(a, v), 0.0, atol=1e-5)
    s_plus = np.maximum(w, eps)
    assert np.all(v <= s_plus * (1 + 1e-6))  # alpha, beta in (0, 1]
    # Only one advantage side moved.
    moved = ~np.isclose(v, s_plus, rtol=1e-6)
    assert not (np.any(moved & (a > 0)) and np.any(moved & (a < 0)))
    # Paper: v >= eps. Holds here (weights near 1); exact bound is min(alpha, beta) * eps.
    if trial % 4:
      assert np.all(v >= eps)
    assert np.all(v > 0)


def test_global_scale_and_identity():
  w = jnp.array([1.0, 2.0, 0.5])
  a = jnp.array([1.0, -1.0, 0.0])
  np.testing.assert_allclose(gt.global_scale(w, a, c=0.5), 0.5 * np.asarray(w))
  np.testing.assert_allclose(gt.identity(w, a), w)


@pytest.mark.parametrize(
    'case', ['zero_adv', 'one_side_pos', 'one_side_neg', 'equal_weights', 'zero_weight', 'single'])
def test_degenerate_groups_finite_with_documented_values(case):
  w = np.array([1.2, 0.8, 1.0, 0.9], np.float32)
  a = np.array([1.0, -0.5, -0.5, 0.0], np.float32)
  if case == 'zero_adv':
    a = np.zeros(4, np.float32)
  elif case == 'one_side_pos':
    a = np.array([1.0, 0.5, 0.0, 0.0], np.float32)
  elif case == 'one_side_neg':
    a = np.array([-1.0, -0.5, 0.0, 0.0], np.float32)
  elif case == 'equal_weights':
    w = np.ones(4, np.float32)
  elif case == 'zero_weight':
    w[1] = 0.0
  elif case == 'single':
    w, a = w[:1], np.zeros(1, np.float32)
  fns = {'min': _MIN, 'orth': _ORTH, 'qp': _QP, 'tr': lambda w, a: _TR(w, a, trunc_eps=1e-3)}
  out = {k: np.asarray(f(w, a)) for k, f in fns.items()}
  for k, f in fns.items():
    assert np.all(np.isfinite(out[k])), k
    grad = jax.grad(lambda w_: jnp.sum(f(w_, a) * jnp.arange(1.0, len(w) + 1)))(jnp.asarray(w))
    assert np.all(np.isfinite(grad)), k
  if case in ('zero_adv', 'single'):
    for k in ('orth', 'qp'):
      np.testing.assert_allclose(out[k], w)
    np.testing.assert_allclose(out['tr'], np.maximum(w, 1e-3))
  if case in ('one_side_pos', 'one_side_neg'):
    expect = np.where(a != 0, 0.0, w)
    np.testing.assert_allclose(out['qp'], expect, atol=1e-7)
    np.testing.assert_allclose(out['qp'], qp_bruteforce(w, a), atol=1e-6)
    np.testing.assert_allclose(out['tr'], np.where(a != 0, 0.0, np.maximum(w, 1e-3)), atol=1e-7)
  if case == 'equal_weights':  # already orthogonal since sum(A) = 0
    for k in ('min', 'orth', 'qp', 'tr'):
      np.testing.assert_allclose(out[k], w, atol=1e-6)
  if case == 'zero_weight':
    np.testing.assert_allclose(out['min'], 0.0)
    np.testing.assert_allclose(out['qp'], qp_bruteforce(w, a), atol=1e-6)


def test_batched_helpers_match_per_group_loop():
  rng = np.random.default_rng(6)
  w_B = np.exp(rng.normal(0, 0.3, 12)).astype(np.float32)
  a_B = rng.normal(size=12).astype(np.float32)
  got = np.asarray(
      gt.transform_batch('pos_orth_proj_qp', jnp.asarray(w_B), jnp.asarray(a_B), group_size=4))
  want = np.concatenate([np.asarray(_QP(w_B[i:i + 4], a_B[i:i + 4])) for i in range(0, 12, 4)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='valid'):
    gt.apply_to_groups('nope', jnp.ones((2, 2)), jnp.ones((2, 2)))
