"""Tests of jtc.models.delta_rule: the recurrent form against a float64 numpy loop of the
paper's update, and the chunked form against the recurrent one (values, final states and
gradients), for lengths that are and are not multiples of the chunk; with bf16 inputs the state
stays float32 and the outputs within bf16 rounding (a bf16 state, the known positive, does not)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import delta_rule

B, N, H, O = 2, 3, 8, 5


def _inputs(L, seed=0):
  rng = np.random.default_rng(seed)
  k = rng.normal(size=(B, L, N, H))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  return dict(q_BLNH=rng.normal(size=(B, L, N, H)) / np.sqrt(H), k_BLNH=k,
              v_BLNH=rng.normal(size=(B, L, N, O)), g_BLN=-rng.uniform(0, 2, (B, L, N)),
              beta_BLN=rng.uniform(size=(B, L, N))), rng.normal(size=(B, N, H, O))


def _numpy_reference(q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN, state_BNHH):
  """S <- a S (I - b k k^T)^T + b k v^T, o = S^T q (the paper's form, transposed), float64."""
  S, outs = np.array(state_BNHH, np.float64), []
  eye = np.eye(H)
  for t in range(q_BLNH.shape[1]):
    k, b = k_BLNH[:, t], beta_BLN[:, t][..., None, None]
    erase = eye - b * np.einsum('bnh,bni->bnhi', k, k)
    S = np.exp(g_BLN[:, t])[..., None, None] * np.einsum('bnhi,bnio->bnho', erase, S)
    S = S + b * np.einsum('bnh,bno->bnho', k, v_BLNH[:, t])
    outs.append(np.einsum('bnho,bnh->bno', S, q_BLNH[:, t]))
  return np.stack(outs, 1), S


def test_recurrent_form_is_the_paper_update():
  x, s0 = _inputs(9)
  want_o, want_s = _numpy_reference(**x, state_BNHH=s0)
  o, s = jax.jit(delta_rule.recurrent)(**x, state_BNHH=s0)
  np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('L, chunk', [(16, 4), (13, 4), (13, 5), (7, 16), (5, 1)])
def test_chunked_form_equals_the_recurrent_form(L, chunk):
  x, s0 = _inputs(L, seed=L + chunk)
  want_o, want_s = jax.jit(delta_rule.recurrent)(**x, state_BNHH=s0)
  o, s = jax.jit(lambda **a: delta_rule.chunked(**a, chunk=chunk))(**x, state_BNHH=s0)
  assert o.shape == (B, L, N, O) and o.dtype == s.dtype == jnp.float32
  np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=2e-5)


def test_chunked_gradients_equal_recurrent_gradients():
  x, s0 = _inputs(11, seed=3)
  w = np.random.default_rng(4).normal(size=(B, 11, N, O))

  def loss(form, q, k, v, g, beta, s):
    o, s = form(q, k, v, g, beta, s)
    return jnp.sum(o * w) + jnp.sum(s**2)

  args = tuple(jnp.asarray(a, jnp.float32) for a in (*x.values(), s0))
  chunked = lambda *a: delta_rule.chunked(*a, chunk=4)
  got = jax.jit(jax.grad(lambda *a: loss(chunked, *a), argnums=range(6)))(*args)
  want = jax.jit(jax.grad(lambda *a: loss(delta_rule.recurrent, *a), argnums=range(6)))(*args)
  for g_got, g_want in zip(got, want):
    np.testing.assert_allclose(g_got, g_want, rtol=1e-4, atol=1e-4)


def test_a_state_carries_a_sequence_across_calls():
  """Two calls, the second from the first's state, equal one call over the whole sequence."""
  x, s0 = _inputs(12, seed=5)
  chunked = jax.jit(lambda **a: delta_rule.chunked(**a, chunk=4))
  whole_o, whole_s = chunked(**x, state_BNHH=s0)
  first = {k: v[:, :7] for k, v in x.items()}
  second = {k: v[:, 7:] for k, v in x.items()}
  o1, s1 = chunked(**first, state_BNHH=s0)
  o2, s2 = chunked(**second, state_BNHH=s1)
  np.testing.assert_allclose(jnp.concatenate([o1, o2], 1), whole_o, rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(s2, whole_s, rtol=1e-5, atol=2e-5)


def test_a_zero_key_value_token_with_no_decay_leaves_the_state():
  x, s0 = _inputs(1)
  x = dict(x, k_BLNH=0 * x['k_BLNH'], v_BLNH=0 * x['v_BLNH'], g_BLN=0 * x['g_BLN'])
  _, s = delta_rule.recurrent(**x, state_BNHH=s0)
  np.testing.assert_allclose(s, s0, rtol=1e-6)


def _bf16_state_recurrent(q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN, state_BNHH):
  """The recurrent form with its state stored in bfloat16 between tokens (what the code must
  not do): each step in float32 from the rounded state, then rounded again."""

  def body(state_BNHH, xs):
    o_BNH, state_BNHH = delta_rule.step(state_BNHH.astype(jnp.float32), *xs)
    return state_BNHH.astype(jnp.bfloat16), o_BNH

  to_L = lambda x: jnp.moveaxis(x, 1, 0)
  state_BNHH, o_LBNH = jax.lax.scan(body, state_BNHH.astype(jnp.bfloat16),
                                    tuple(map(to_L, (q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN))))
  return jnp.moveaxis(o_LBNH, 0, 1), state_BNHH


def test_bf16_compute_keeps_a_float32_state_and_stays_within_bf16_rounding():
  """bf16 inputs (the compute dtype's q, k, v, gates), float32 state: both forms return float32
  and stay within 4u of the exact run (float64 numpy) over 1024 tokens, u = 2^-9 being bf16's
  unit round-off: each of q, k and v is rounded by at most u and the output is linear in each
  (measured 1.6u). Known positive: the state stored in bf16 between tokens drifts further
  (measured 12.5u, 8x the bf16-compute error). The inputs make the state a long sum: decay
  e^g >= 0.999 per token, write strength b <= 0.02, so each token's write is small beside the
  state and rounding the state drops part of it."""
  L, u = 1024, 2.0**-9
  rng = np.random.default_rng(7)
  x, _ = _inputs(L, seed=7)
  x = dict(x, g_BLN=-rng.uniform(0, 1e-3, (B, L, N)), beta_BLN=rng.uniform(0, 0.02, (B, L, N)))
  zero = jnp.zeros((B, N, H, O), jnp.float32)
  bf16 = {k: jnp.asarray(v, jnp.bfloat16) for k, v in x.items()}
  want_o, _ = _numpy_reference(**x, state_BNHH=np.zeros((B, N, H, O)))  # float64
  err = lambda o: float(np.sqrt(np.mean((np.asarray(o) - want_o)**2) / np.mean(want_o**2)))
  errs = []
  for form in (jax.jit(lambda **a: delta_rule.chunked(**a, chunk=64)),
               jax.jit(delta_rule.recurrent)):
    o, s = form(**bf16, state_BNHH=zero)
    assert o.dtype == s.dtype == jnp.float32
    errs.append(err(o))
  assert max(errs) <= 4 * u, np.array(errs) / u
  bf16_state_o, bf16_state_s = jax.jit(_bf16_state_recurrent)(**bf16, state_BNHH=zero)
  assert bf16_state_s.dtype == jnp.bfloat16
  assert err(bf16_state_o) > max(8 * u, 4 * max(errs)), (err(bf16_state_o) / u, max(errs) / u)
