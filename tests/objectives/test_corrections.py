"""Rollout-training mismatch corrections (jtc.objectives.corrections): closed forms on hand-made
tensors, and a planted mismatch on a tiny vocabulary where the exact on-policy gradient is
enumerated: with every correction the expected gradient is closer to the exact one."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import objectives
from jtc.objectives import corrections

# rho = 0.25, 0.8, 1.0, 1.5, 3.0 on real tokens; the last column is padding.
RHO = np.array([[0.25, 0.8, 1.0, 9.0], [1.5, 3.0, 1.0, 9.0]])
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], np.float32)


def _weights(name, **kw):
  sampler = np.log(np.full(RHO.shape, 0.3))
  w, m = corrections.weights(name, jnp.asarray(sampler + np.log(RHO), jnp.float32),
                             jnp.asarray(sampler, jnp.float32), jnp.asarray(MASK), **kw)
  return np.asarray(w), {k: float(v) for k, v in m.items()}


def test_token_level_closed_forms():
  w, m = _weights('none')
  np.testing.assert_allclose(w, MASK)
  w, m = _weights('tis', cap=2.0)  # min(rho, 2)
  np.testing.assert_allclose(w, [[0.25, 0.8, 1.0, 0], [1.5, 2.0, 1.0, 0]], rtol=1e-6)
  assert m['frac_truncated'] == pytest.approx(1 / 6) and m['frac_masked'] == 0
  w, m = _weights('mis', cap=2.0)  # rho inside [1/2, 2], else 0
  np.testing.assert_allclose(w, [[0, 0.8, 1.0, 0], [1.5, 0, 1.0, 0]], rtol=1e-6)
  assert m['frac_masked'] == pytest.approx(2 / 6) and m['frac_truncated'] == 0
  w, m = _weights('icepop', icepop_low=0.5, icepop_high=2.5)  # rho inside [0.5, 2.5]
  np.testing.assert_allclose(w, [[0, 0.8, 1.0, 0], [1.5, 0, 1.0, 0]], rtol=1e-6)
  w, _ = _weights('icepop', icepop_low=0.2, icepop_high=5.0)
  np.testing.assert_allclose(w, np.where(MASK > 0, RHO, 0), rtol=1e-6)


def test_sequence_level_closed_forms():
  # Sequence ratios: 0.25 * 0.8 * 1 = 0.2 and 1.5 * 3 * 1 = 4.5 (padding excluded).
  w, m = _weights('seq_tis', cap=2.0)
  np.testing.assert_allclose(w, [[0.2] * 3 + [0], [2.0] * 3 + [0]], rtol=1e-5)
  assert m['frac_truncated'] == pytest.approx(0.5)
  w, m = _weights('seq_mask', cap=6.0)  # 0.2 and 4.5 both inside [1/6, 6]
  np.testing.assert_allclose(w, [[0.2] * 3 + [0], [4.5] * 3 + [0]], rtol=1e-5)
  w, m = _weights('seq_mask', cap=4.0)  # 0.2 < 1/4 and 4.5 > 4: both masked
  np.testing.assert_allclose(w, np.zeros_like(RHO))
  assert m['frac_masked'] == 1.0


def test_mismatch_metrics_closed_form():
  train = np.log(RHO) + np.log(0.3)
  m = corrections.mismatch_metrics(jnp.asarray(train, jnp.float32),
                                   jnp.full(RHO.shape, np.log(0.3), jnp.float32), jnp.asarray(MASK))
  d = np.log(RHO[:, :3]).ravel()
  assert float(m['mean_abs']) == pytest.approx(np.abs(d).mean(), rel=1e-5)
  assert float(m['max_abs']) == pytest.approx(np.abs(d).max(), rel=1e-5)  # padding's 9 excluded
  assert float(m['mean']) == pytest.approx(d.mean(), rel=1e-5)
  assert float(m['seq_mean_abs']) == pytest.approx(np.mean(np.abs([np.log(0.2),
                                                                   np.log(4.5)])), rel=1e-5)
  assert float(m['p99_abs']) == pytest.approx(np.abs(d).max(), rel=1e-5)  # 6 tokens: the largest
  assert float(m['frac_beyond_cap']) == pytest.approx(2 / 6)  # |log rho| > log 2: 0.25 and 3


@pytest.mark.parametrize('name, kw, match', [
    ('nope', {}, r"config.rollout.correction='nope' is not valid; valid: \['none', 'tis'"),
    ('tis', dict(cap=1.0), r'correction_cap=1.0 must be > 1'),
    ('tis', dict(behaviour_logps='sampler'), r"needs behaviour_logps='recompute'"),
    ('icepop', dict(icepop_low=1.5), r'must satisfy 0 < low < 1 < high'),
])
def test_bad_corrections_are_named(name, kw, match):
  args = dict(cap=2.0, icepop_low=0.5, icepop_high=5.0, behaviour_logps='recompute')
  with pytest.raises(ValueError, match=match):
    corrections.check(name, **{**args, **kw})


# -------------------------------------------------------------------------------------------
# A planted mismatch: a tabular two-token policy over V = 4 symbols, its sampler in bfloat16.

V, T = 4, 2
SEQUENCES = np.array(list(itertools.product(range(V), repeat=T)))  # [16, 2]


def _logps(theta, dtype=jnp.float32):
  """[16, T] per-token log-probs of every sequence under the tabular policy (computed in
  ``dtype``: bfloat16 plays a sampler whose matmuls run in bf16)."""
  first, second = theta
  lp1 = jax.nn.log_softmax(first.astype(dtype).astype(jnp.float32))
  lp2 = jax.nn.log_softmax(second.astype(dtype).astype(jnp.float32), axis=-1)
  y1, y2 = SEQUENCES[:, 0], SEQUENCES[:, 1]
  return jnp.stack([lp1[y1], lp2[y1, y2]], axis=-1)


def _expected_gradient(theta, sampler_logps, reward, correction, name):
  """E_{y ~ sampler}[grad_theta loss(y)]: every sequence once, weighted by its sampler
  probability. loss(y) is objective ``name`` on that one sequence (group of one), with the
  trainer's recomputed behaviour log-probs as old log-probs (on-policy ratio 1) and advantage
  R(y) - E_pi R: the usual policy-gradient estimator fed the sampler's tokens."""
  train_logps = jax.lax.stop_gradient(_logps(theta))
  p_train = jnp.exp(train_logps.sum(-1))
  advantages = reward - jnp.sum(p_train * reward)
  mask = jnp.ones((len(SEQUENCES), T))
  w, _ = corrections.weights(correction, train_logps, sampler_logps, mask, cap=2.0)

  def loss(th):
    per = [
        objectives.compute_loss(name, logps=_logps(th)[i:i + 1], old_logps=train_logps[i:i + 1],
                                advantages=advantages[i:i + 1], mask=mask[i:i + 1], group_size=1,
                                is_weights=w[i:i + 1])[0] for i in range(len(SEQUENCES))
    ]
    return jnp.sum(jnp.exp(sampler_logps.sum(-1)) * jnp.stack(per))

  return jax.grad(loss)(theta)


@pytest.mark.parametrize('name', ['grpo', pytest.param('gspo', marks=pytest.mark.slow)])
def test_a_correction_reduces_the_bias_of_a_bf16_sampler(name):
  rng = np.random.default_rng(0)
  theta = (jnp.asarray(rng.normal(0, 3, V),
                       jnp.float32), jnp.asarray(rng.normal(0, 3, (V, V)), jnp.float32))
  reward = jnp.asarray(rng.uniform(size=len(SEQUENCES)), jnp.float32)
  flat = lambda g: np.concatenate([np.ravel(x) for x in g])
  exact = flat(_expected_gradient(theta, _logps(theta), reward, 'none', name))
  planted = _logps(theta, jnp.bfloat16)  # the sampler's distribution and log-probs
  delta = np.abs(np.asarray(planted - _logps(theta))).max()
  assert 1e-3 < delta < np.log(2.0)  # a real mismatch, inside every correction's bounds
  bias = {
      c: np.linalg.norm(flat(_expected_gradient(theta, planted, reward, c, name)) - exact)
      for c in corrections.CORRECTIONS
  }
  assert bias['none'] > 1e-4 * np.linalg.norm(exact)  # the planted mismatch biases the gradient
  for c in corrections.CORRECTIONS[1:]:
    assert bias[c] < bias['none'], bias
