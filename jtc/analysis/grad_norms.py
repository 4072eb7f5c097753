"""Per-token gradient norms ||grad_theta log pi_{b,t}||, which the diagnostics weigh by each
token's loss coefficient (Eq. 24's per-token gradient grad l_{b,t} = c_{b,t} grad log pi_{b,t}):

  exact_grad_norms     a Jacobian row per token, all parameters (small models, notebooks).
  lm_head_grad_norms   the gradient norm of the LM-head row only, ||h|| ||e_y - p||, any size,
                       in vocabulary chunks and without cancellation when the model is sure.
  token_grad_norms     either, by name (`GRAD_NORM_MODES`).

Dimension key (docs/dimensions.md): B batch, T completion length, L = P + T, D model dim,
V vocabulary.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp

from jtc.models import layers
from jtc.models import logprobs
from jtc.models import model as model_lib


def _row_logps_fn(config, tokens_L, input_mask_L, completion_start):

  def fn(params):
    out = logprobs.sequence_logprobs(params, config, tokens_L[None], input_mask_L[None],
                                     completion_start=completion_start)
    return out['logps'][0]

  return fn


def exact_grad_norms(params, config, tokens_BL, input_mask_BL, *, completion_start):
  """||grad_theta log pi(y_{b,t} | h_{b,t})||_2 over all parameters, exactly. [B, T] float32.

  One reverse-mode Jacobian per row (`jax.jacrev`: one forward, T vector-Jacobian products),
  rows in sequence (`jax.lax.map`). Memory ~ T x num_params floats; cost ~ B T backward passes.
  For small models (the tiny policy: B=16, T=32 takes seconds); use mode='proxy' otherwise.
  A mixture of experts runs its 'blocks' form here (`jax.jacrev` cannot batch 'ragged').
  """
  chex.assert_rank([tokens_BL, input_mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, input_mask_BL])
  if config.is_moe and config.moe_impl == 'ragged':
    # `jax.jacrev` batches the backward pass and `ragged_dot`'s weight gradient has no batching
    # rule: the same experts computed in blocks (equal to float rounding, jtc.models.moe).
    config = dataclasses.replace(config, moe_impl='blocks')

  def row(args):
    tokens_L, mask_L = args
    jac = jax.jacrev(_row_logps_fn(config, tokens_L, mask_L, completion_start))(params)
    sq_T = sum(
        jnp.sum(jnp.square(x.astype(jnp.float32)).reshape(x.shape[0], -1), axis=-1)
        for x in jax.tree_util.tree_leaves(jac))
    return jnp.sqrt(sq_T)

  return jax.lax.map(row, (tokens_BL, input_mask_BL))


def lm_head_grad_norms(hidden_BTD, head_DV, targets_BT, *, vocab_chunk=8192):
  """LM-head proxy of ||grad_theta log pi(y_t | h_t)||: the exact gradient norm w.r.t. the
  output projection W [D, V] alone (the trunk, and so h_t, held fixed). [B, T] float32.

  Derivation. z = W^T h, log pi(y) = z_y - logsumexp(z), so d log pi(y) / d W[:, v] =
  h (1[v = y] - p_v), i.e. grad_W log pi(y) = h (e_y - p)^T, a rank-one matrix with Frobenius
  norm ||h|| * ||e_y - p||, and
      ||e_y - p||^2 = (1 - p_y)^2 + sum_{v != y} p_v^2 = exp(2 (m - lse)) (s_1^2 + s_2),
  with m the largest logit other than z_y, s_k = sum_{v != y} exp(k (z_v - m)) and lse the
  log-sum-exp of all of z. Both terms are sums of positive numbers (`_non_target_sums`: one
  chunked pass over the vocabulary that leaves y out, never a [B, T, V] array), so the norm keeps
  its relative precision when the model is sure of y; the algebraically equal
  1 - 2 p_y + sum_v p_v^2 cancels there (p_y = 1 - 1e-4 loses every digit in float32). Since
  sum_{v != y} p_v^2 <= (1 - p_y)^2, the proxy lies in [1, sqrt 2] x (1 - p_y) ||h||, the
  output-row proxy of DelTA (`delta_geometry.lm_head_proxy`). With tied embeddings this is the part
  of the embedding gradient that flows through the head; it ignores the trunk.

  Args:
    hidden_BTD: [B, T, D] final-normed hidden states that predicted the tokens.
    head_DV: [D, V] output projection (`model.lm_head_DV`).
    targets_BT: [B, T] token ids.
  """
  chex.assert_rank([hidden_BTD, head_DV, targets_BT], [3, 2, 2])
  hidden_BTD = hidden_BTD.astype(jnp.float32)
  head_DV = head_DV.astype(jnp.float32)
  m_BT, s1_BT, s2_BT = _non_target_sums(hidden_BTD, head_DV, targets_BT, vocab_chunk=vocab_chunk)
  target_logit_BT = jnp.einsum('BTD,DBT->BT', hidden_BTD, jnp.take(head_DV, targets_BT, axis=1))
  lse_BT = jnp.logaddexp(m_BT + jnp.log(s1_BT), target_logit_BT)
  dist_BT = jnp.exp(m_BT - lse_BT) * jnp.sqrt(jnp.square(s1_BT) + s2_BT)
  return jnp.linalg.norm(hidden_BTD, axis=-1) * dist_BT


def _non_target_sums(hidden_BTD, head_DV, targets_BT, *, vocab_chunk):
  """(m, s_1, s_2) [B, T] over the vocabulary without the target: m = max_{v != y} z_v and
  s_k = sum_{v != y} exp(k (z_v - m)), by an online scan over chunks of C columns."""
  if vocab_chunk <= 0:
    raise ValueError(f'vocab_chunk must be positive, got {vocab_chunk!r}')
  D, V = head_DV.shape
  C = min(vocab_chunk, V)
  n = -(-V // C)
  head_nDC = jnp.pad(head_DV, ((0, 0), (0, n * C - V))).reshape(D, n, C).transpose(1, 0, 2)
  ids_nC = jnp.arange(n * C).reshape(n, C)

  def chunk(carry, xs):
    m_BT, s1_BT, s2_BT = carry
    head_DC, ids_C = xs
    keep_BTC = (ids_C < V) & (ids_C != targets_BT[..., None])
    z_BTC = jnp.where(keep_BTC, jnp.einsum('BTD,DC->BTC', hidden_BTD, head_DC), layers.MASKED)
    new_m_BT = jnp.maximum(m_BT, jnp.max(z_BTC, axis=-1))
    decay_BT = jnp.exp(m_BT - new_m_BT)
    e_BTC = jnp.where(keep_BTC, jnp.exp(z_BTC - new_m_BT[..., None]), 0.0)
    return (new_m_BT, s1_BT * decay_BT + jnp.sum(e_BTC, axis=-1),
            s2_BT * jnp.square(decay_BT) + jnp.sum(jnp.square(e_BTC), axis=-1)), None

  B, T = targets_BT.shape
  zeros_BT = jnp.zeros((B, T), jnp.float32)
  init = (jnp.full((B, T), layers.MASKED, jnp.float32), zeros_BT, zeros_BT)
  (m_BT, s1_BT, s2_BT), _ = jax.lax.scan(chunk, init, (head_nDC, ids_nC))
  return m_BT, s1_BT, s2_BT


def _proxy_norms(params, config, tokens_BL, input_mask_BL, *, completion_start):
  out = logprobs.sequence_logprobs(params, config, tokens_BL, input_mask_BL,
                                   completion_start=completion_start, return_hidden=True)
  return lm_head_grad_norms(out['hidden'], model_lib.lm_head_DV(params, config),
                            tokens_BL[:, completion_start:])


GRAD_NORM_MODES = {'exact': exact_grad_norms, 'proxy': _proxy_norms}


def check_mode(mode):
  """ValueError naming the valid modes for another ``mode``."""
  if mode not in GRAD_NORM_MODES:
    raise ValueError(f'unknown grad-norm mode {mode!r}; valid: {sorted(GRAD_NORM_MODES)}')


def token_grad_norms(params, config, tokens_BL, input_mask_BL, *, completion_start, mode):
  """||grad_theta log pi_{b,t}|| [B, T] by `mode`: 'exact' (all parameters, small models) or
  'proxy' (LM-head gradient norm, `lm_head_grad_norms`)."""
  check_mode(mode)
  return GRAD_NORM_MODES[mode](params, config, tokens_BL, input_mask_BL,
                               completion_start=completion_start)
