"""Tests of jtc.analysis.grad_norms: the LM-head proxy is the norm of the head's gradient, an
unknown mode is named, the proxy keeps float64 precision where the model is sure, and the exact
norms of a mixture of experts in its 'ragged' form match a per-token gradient loop."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import grad_norms
from jtc.models import model
from jtc.models import logprobs


def _cfg(**kw):
  return model.ModelConfig.tiny(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                head_dim=16, d_ff=64, **kw)


def test_lm_head_proxy_is_head_gradient_norm():
  cfg = _cfg(tie_embeddings=False)
  params = model.init_params(cfg, jax.random.key(4))
  tokens = jnp.asarray(np.random.default_rng(4).integers(3, 16, size=(2, 7)), jnp.int32)
  inm = jnp.ones_like(tokens)
  proxy = jax.jit(lambda p: grad_norms.token_grad_norms(p, cfg, tokens, inm, completion_start=3,
                                                        mode='proxy'))(params)

  @jax.jit
  def head_grad_norm(head, b, t):

    def f(h):
      p = {**params, 'lm_head': {'kernel': h}}
      return logprobs.sequence_logprobs(p, cfg, tokens, inm, completion_start=3)['logps'][b, t]

    return jnp.linalg.norm(jax.grad(f)(head))

  for b, t in [(0, 0), (1, 3)]:
    ref = float(head_grad_norm(params['lm_head']['kernel'], b, t))
    np.testing.assert_allclose(proxy[b, t], ref, rtol=1e-4)
  with pytest.raises(ValueError, match="'fast'"):
    grad_norms.token_grad_norms(params, cfg, tokens, inm, completion_start=3, mode='fast')


def test_lm_head_proxy_keeps_its_precision_when_the_model_is_sure():
  """||h|| ||e_y - p|| against float64 at target margins up to 20 nats (1 - p_y ~ 1e-7), for
  chunkings that do and do not divide V; float32 1 - 2 p_y + sum p^2 loses every digit there."""
  rng = np.random.default_rng(6)
  D, V, margins = 8, 50, np.array([0.0, 4.0, 9.0, 14.0, 20.0])
  h = rng.normal(size=(1, len(margins), D))
  W = rng.normal(size=(D, V)) / np.sqrt(D)
  y = rng.integers(0, V, size=(1, len(margins)))
  head = np.repeat(W[None], len(margins), axis=0)  # one head per position, margins differ
  for t, margin in enumerate(margins):
    z = h[0, t] @ head[t]
    others = np.delete(z, y[0, t])
    head[t][:, y[0, t]] += h[0, t] * (others.max() + margin - z[y[0, t]]) / (h[0, t] @ h[0, t])
  h32, head32 = h.astype(np.float32), head.astype(np.float32)
  for t in range(len(margins)):
    z = h32[0, t].astype(np.float64) @ head32[t].astype(np.float64)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    e = np.zeros(V)
    e[y[0, t]] = 1.0
    ref = np.linalg.norm(h32[0, t].astype(np.float64)) * np.linalg.norm(e - p)
    for chunk in (7, 16, V):
      got = grad_norms.lm_head_grad_norms(jnp.asarray(h32[:, t:t + 1]), jnp.asarray(head32[t]),
                                          jnp.asarray(y[:, t:t + 1]), vocab_chunk=chunk)
      np.testing.assert_allclose(float(got[0, 0]), ref, rtol=1e-4, err_msg=f'{margin=} {chunk=}')
    p32 = p.astype(np.float32)
    naive = np.sqrt(max(np.float32(1) - 2 * p32[y[0, t]] + np.sum(p32 * p32), 0.0))
    if margins[t] == 20.0:  # the control: the cancelling form is far off where this one is not
      assert abs(naive * np.linalg.norm(h32[0, t]) - ref) > 0.5 * ref


@pytest.mark.slow
def test_exact_grad_norms_of_a_ragged_mixture_of_experts_match_a_grad_loop():
  """`jax.jacrev` cannot batch `ragged_dot`'s weight gradient: a 'ragged' MoE's exact norms
  (computed in blocks) equal each token's own `jax.grad` through the 'ragged' form."""
  cfg = model.ModelConfig.tiny_moe(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                                   head_dim=8, n_experts=4, d_expert=8, moe_impl='ragged')
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, 16)
  mask = jnp.ones_like(tokens)
  norms = grad_norms.exact_grad_norms(params, cfg, tokens, mask, completion_start=2)

  @jax.jit
  def grad_bt(q, b, t):
    f = lambda q: logprobs.sequence_logprobs(q, cfg, tokens, mask, completion_start=2)['logps'][b, t
                                                                                               ]
    return jax.grad(f)(q)

  for b, t in [(0, 0), (1, 3)]:
    ref = np.sqrt(
        sum(
            np.sum(np.square(np.asarray(x, np.float64)))
            for x in jax.tree.leaves(grad_bt(params, b, t))))
    np.testing.assert_allclose(norms[b, t], ref, rtol=1e-4)
