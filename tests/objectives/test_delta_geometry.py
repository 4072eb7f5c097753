"""Tests of jtc.objectives.delta_geometry: the token-gradient proxies (the LM-head row gradient and
the top-k hidden-state proxy) against autodiff."""
import jax
import jax.numpy as jnp
import numpy as np

from jtc.objectives import delta_geometry
from tests.objectives.delta_reference import D


def lm_logp(w_VD, h_D, y):
  """Tiny LM head: logits = W h, log-softmax, log p(y)."""
  return jax.nn.log_softmax(w_VD @ h_D)[y]


def test_lm_head_proxy_identity():
  """grad_{W_y} log p(y) = (1 - p(y)) h  (DelTA Implementation)."""
  r = np.random.default_rng(0)
  w = jnp.asarray(r.normal(size=(7, D)), jnp.float32)
  hs = jnp.asarray(r.normal(size=(3, D)), jnp.float32)
  ys = [2, 5, 2]
  for h_D, y in zip(hs, ys):
    grad_VD = jax.grad(lm_logp)(w, h_D, y)
    np.testing.assert_allclose(grad_VD[y], delta_geometry.lm_head_proxy(h_D, lm_logp(w, h_D, y)),
                               rtol=1e-5, atol=1e-6)


def test_lm_head_proxy_keeps_its_precision_when_the_model_is_sure():
  """(1 - p) h at log p from -1e-2 to -1e-9 against float64; 1 - exp(log p) in float32 (the
    earlier form) is the failing control: wrong by ~5% at -1e-6 and exactly 0 at -1e-8."""
  logps = np.array([-1e-2, -1e-4, -1e-5, -1e-6, -1e-8, -1e-9])
  h_CD = np.ones((len(logps), D))
  want = -np.expm1(logps)[:, None] * h_CD
  got = np.asarray(
      delta_geometry.lm_head_proxy(jnp.asarray(h_CD, jnp.float32), jnp.asarray(logps, jnp.float32)))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  cancelling = 1.0 - np.exp(logps.astype(np.float32))
  assert np.abs(cancelling[3] / -np.expm1(logps[3]) - 1) > 1e-2 and cancelling[4] == 0.0


def test_topk_hidden_proxy_full_vocab_is_hidden_gradient():
  r = np.random.default_rng(1)
  v_, k_ = 7, 7
  w = jnp.asarray(r.normal(size=(v_, D)), jnp.float32)
  h_CD = jnp.asarray(r.normal(size=(3, D)), jnp.float32)
  ids = jnp.array([2, 5, 0])
  got = delta_geometry.topk_hidden_proxy(h_CD, ids, w, topk=k_)
  want = jnp.stack([jax.grad(lm_logp, argnums=1)(w, h_CD[c], ids[c]) for c in range(3)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Truncating to the top-1 token keeps only the most likely row of the expectation.
  probs = jax.nn.softmax(h_CD @ w.T, axis=-1)
  top1 = jnp.argmax(probs, axis=-1)
  want1 = w[ids] - jnp.max(probs, axis=-1)[:, None] * w[top1]
  np.testing.assert_allclose(delta_geometry.topk_hidden_proxy(h_CD, ids, w, topk=1), want1,
                             rtol=1e-5, atol=1e-6)
