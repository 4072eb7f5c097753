"""Tests of jtc.models.logprobs: vocabulary-chunked log-probs, entropies and their gradients equal
the plain log-softmax's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import model as model_lib
from jtc.models import logprobs
from tests.models.model_reference import CONFIGS, random_params, padded_batch, ROWS


def _naive_token_logprobs(hidden_BTD, head_DV, targets_BT):
  logits = jnp.einsum('BTD,DV->BTV', hidden_BTD, head_DV).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  tgt = jnp.take_along_axis(logp, targets_BT[..., None], axis=-1)[..., 0]
  return tgt, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@pytest.mark.parametrize('vocab_chunk', [7, 1000])
def test_token_logprobs_and_grads_match_naive(vocab_chunk):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(3), 4)
  B, T, D, V = 2, 5, 8, 37  # V not a multiple of the chunk: exercises the padding.
  hidden = jax.random.normal(k1, (B, T, D))
  head = 2.0 * jax.random.normal(k2, (D, V))
  targets = jax.random.randint(k3, (B, T), 0, V)
  weights = jax.random.normal(k4, (2, B, T))

  def loss(fn, hidden, head):
    logps, ent = fn(hidden, head, targets)
    return jnp.sum(weights[0] * logps) + jnp.sum(weights[1] * ent)

  chunked = lambda h, w, t: logprobs.token_logprobs(h, w, t, vocab_chunk=vocab_chunk)
  got = jax.jit(chunked)(hidden, head, targets)
  want = _naive_token_logprobs(hidden, head, targets)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  g_got = jax.jit(jax.grad(lambda h, w: loss(chunked, h, w), argnums=(0, 1)))(hidden, head)
  g_want = jax.grad(lambda h, w: loss(_naive_token_logprobs, h, w), argnums=(0, 1))(hidden, head)
  for g, w in zip(g_got, g_want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_sequence_logprobs_matches_full_logits_and_grads():
  config = CONFIGS['gqa_tied']  # tied: gradients reach the embedding through both uses
  params = random_params(config)
  P = 8
  tokens, mask = padded_batch(ROWS, P)
  completion = jnp.array([[4, 9, 1, 0], [7, 7, 2, 0], [3, 0, 0, 0]], jnp.int32)
  comp_mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], jnp.int32)
  tokens = jnp.concatenate([tokens, completion], 1)
  mask = jnp.concatenate([mask, comp_mask], 1)

  def chunked_loss(params):
    out = logprobs.sequence_logprobs(params, config, tokens, mask, completion_start=P,
                                     vocab_chunk=16, return_hidden=True)
    return jnp.sum(-out['logps'] * comp_mask) / jnp.sum(comp_mask), out

  def naive_loss(params):
    out = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask), mask,
                            return_hidden=True)
    logp = jax.nn.log_softmax(out.logits_BLV[:, P - 1:-1], axis=-1)
    logps = jnp.take_along_axis(logp, tokens[:, P:, None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.sum(-logps * comp_mask) / jnp.sum(comp_mask), (logps, ent, out.hidden_BLD)

  (l1, out), g1 = jax.jit(jax.value_and_grad(chunked_loss, has_aux=True))(params)
  (l2, (logps, ent, hidden)), g2 = jax.jit(jax.value_and_grad(naive_loss, has_aux=True))(params)
  assert out['logps'].shape == out['entropy'].shape == (3, 4)
  np.testing.assert_allclose(out['logps'], logps, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['entropy'], ent, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['hidden'], hidden[:, P - 1:-1], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1,
                         g2)
