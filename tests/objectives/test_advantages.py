"""Tests of jtc.objectives.advantages against plain-loop references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.objectives import advantages


@functools.lru_cache(maxsize=None)
def _jitted(name, group_size, eps, std_ddof, batch_normalize):
  return jax.jit(
      functools.partial(advantages.compute_advantages, name, group_size=group_size, eps=eps,
                        std_ddof=std_ddof, batch_normalize=batch_normalize))


def _loop_reference(name, rewards, g, eps, ddof):
  out = np.zeros(len(rewards))
  for start in range(0, len(rewards), g):
    r = [float(x) for x in rewards[start:start + g]]
    if max(r) == min(r):
      continue  # zero-variance group: exactly 0
    mean = sum(r) / g
    for i in range(g):
      if name == 'grpo':
        var = sum((x - mean)**2 for x in r) / (g - ddof)
        out[start + i] = (r[i] - mean) / (var**0.5 + eps)
      elif name == 'dr_grpo':
        out[start + i] = r[i] - mean
      else:  # rloo: leave-one-out mean of the others
        others = [r[j] for j in range(g) if j != i]
        out[start + i] = r[i] - sum(others) / len(others)
  return out


def _rewards(seed, g, m=5):
  rng = np.random.default_rng(seed)
  r = rng.integers(0, 3, size=m * g).astype(np.float32)  # discrete, so ties are common
  r[:g] = 1.0  # one zero-variance group
  r[g:2 * g] = rng.normal(size=g)
  return r


@pytest.mark.parametrize('name,ddof', [('grpo', 0), ('grpo', 1), ('dr_grpo', 0), ('rloo', 0)])
def test_matches_loop_reference(name, ddof):
  g = 4
  r = _rewards(0, g)
  adv, metrics = _jitted(name, g, 1e-6, ddof, False)(r)
  np.testing.assert_allclose(adv, _loop_reference(name, r, g, 1e-6, ddof), rtol=1e-5, atol=1e-6)
  n_const = sum(len(set(r[i:i + g])) == 1 for i in range(0, len(r), g))
  np.testing.assert_allclose(metrics['frac_zero_std'], n_const / (len(r) // g))
  # Zero-mean in every group (premise of Eq. 6) and exact zeros in constant groups.
  np.testing.assert_allclose(np.asarray(adv).reshape(-1, g).sum(-1), 0.0, atol=1e-5)
  assert np.all(np.asarray(adv)[:g] == 0.0)


def test_rloo_is_rescaled_dr_grpo():
  g = 5
  r = _rewards(1, g)
  a_rloo, _ = _jitted('rloo', g, 1e-6, 0, False)(r)
  a_dr, _ = _jitted('dr_grpo', g, 1e-6, 0, False)(r)
  np.testing.assert_allclose(a_rloo, g / (g - 1) * np.asarray(a_dr), rtol=1e-5, atol=1e-6)


def test_batch_normalize():
  g = 4
  r = _rewards(2, g)
  a, _ = _jitted('dr_grpo', g, 1e-6, 0, False)(r)
  a_n, _ = _jitted('dr_grpo', g, 1e-6, 0, True)(r)
  a = np.asarray(a, np.float64)
  np.testing.assert_allclose(a_n, a / (a.std() + 1e-6), rtol=1e-5)
  assert np.all(np.asarray(a_n)[:g] == 0.0)


def test_all_constant_batch_is_zero_not_nan():
  r = np.ones(8, np.float32)
  for name in advantages.ADVANTAGES:
    for bn in (False, True):
      adv, m = _jitted(name, 4, 0.0, 0, bn)(r)
      assert np.all(np.asarray(adv) == 0.0)
      assert float(m['frac_zero_std']) == 1.0
      assert all(np.isfinite(v) for v in m.values())


def test_bad_inputs():
  r = np.zeros(6, np.float32)
  with pytest.raises(ValueError, match="valid: \\['dr_grpo', 'grpo', 'rloo'\\]"):
    advantages.compute_advantages('ppo', r, group_size=3)
  with pytest.raises(ValueError, match='multiple of group_size'):
    advantages.compute_advantages('grpo', r, group_size=4)
  with pytest.raises(ValueError, match='shape'):
    advantages.compute_advantages('grpo', r.reshape(2, 3), group_size=3)
  with pytest.raises(ValueError, match='rloo'):
    advantages.compute_advantages('rloo', r, group_size=1)
  with pytest.raises(ValueError, match='std_ddof'):
    advantages.compute_advantages('grpo', r, group_size=3, std_ddof=2)


def test_keep_sign_zeroes_the_other_sign_and_both_is_the_identity():
  adv_B, _ = advantages.compute_advantages('grpo', jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
                                           group_size=3)
  pos_B = advantages.keep_sign(adv_B, 'positive')
  neg_B = advantages.keep_sign(adv_B, 'negative')
  np.testing.assert_array_equal(pos_B + neg_B, adv_B)
  assert bool(jnp.all(pos_B >= 0)) and bool(jnp.all(neg_B <= 0)) and float(jnp.sum(pos_B)) > 0
  assert advantages.keep_sign(adv_B, 'both') is adv_B
  with pytest.raises(ValueError, match=r"sign='pos'; valid: both, positive, negative"):
    advantages.keep_sign(adv_B, 'pos')
