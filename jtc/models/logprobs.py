"""Per-token log-probabilities and entropies without [B, T, V] logits: a vocabulary-chunked
online log-sum-exp (`token_logprobs`) and the completion log-probs of [prompt | completion]
rows (`sequence_logprobs`), which the update, the behaviour pass, the diagnostics and the
analysis all use. Gradients are exact.

Dimension key (docs/dimensions.md): B batch, T completion length, L = P + T, P prompt width, D model dim,
V vocab, C vocab chunk, n number of chunks, Y layers, W experts per token.
"""

import chex
import jax
import jax.numpy as jnp

from jtc.models import layers
from jtc.models import model as model_lib
from jtc.models import moe
from jtc.models.model_config import ModelConfig


def token_logprobs(hidden_BTD, head_DV, targets_BT, *, vocab_chunk: int = 8192):
  """log p(target) and entropy of softmax(hidden @ head), without [B, T, V] logits.

  With z = hidden @ head (float32), lse = log sum_v exp z_v:
    logp_t = z_t[target_t] - lse_t,   entropy_t = lse_t - sum_v softmax(z_t)_v z_tv.
  The vocabulary is scanned in chunks of C columns with an online log-sum-exp (running max
  m, s = sum exp(z - m), w = sum exp(z - m) z); the chunk body is rematerialised so the
  backward pass also holds one [B, T, C] chunk at a time. Gradients are exact.

  Args:
    hidden_BTD: [B, T, D] hidden states (any float dtype; matmul accumulates in float32).
    head_DV: [D, V] output projection (`model_lib.lm_head_DV(params, config)`).
    targets_BT: [B, T] int target ids.
    vocab_chunk: C, columns per chunk (V is padded up to a multiple of C internally).

  Returns:
    (logps_BT float32, entropy_BT float32).
  """
  chex.assert_rank([hidden_BTD, head_DV, targets_BT], [3, 2, 2])
  chex.assert_equal_shape_prefix([hidden_BTD, targets_BT], 2)
  if vocab_chunk <= 0:
    raise ValueError(f'vocab_chunk must be positive, got {vocab_chunk!r}')
  D, V = head_DV.shape
  C = min(vocab_chunk, V)
  n = -(-V // C)
  head_DV = head_DV.astype(hidden_BTD.dtype)
  head_nDC = jnp.pad(head_DV, ((0, 0), (0, n * C - V))).reshape(D, n, C).transpose(1, 0, 2)
  valid_nC = (jnp.arange(n * C) < V).reshape(n, C)

  @jax.checkpoint
  def chunk(carry, xs):
    m_BT, s_BT, w_BT = carry
    head_DC, valid_C = xs
    z_BTC = jnp.einsum('BTD,DC->BTC', hidden_BTD, head_DC, preferred_element_type=jnp.float32)
    z_BTC = jnp.where(valid_C, z_BTC, layers.MASKED)
    new_m_BT = jnp.maximum(m_BT, jnp.max(z_BTC, axis=-1))
    # The running max is only a numerical shift: lse = m + log s and w / s do not depend on
    # it, so treating it as a constant leaves every gradient exact.
    new_m_BT = jax.lax.stop_gradient(new_m_BT)
    decay_BT = jnp.exp(m_BT - new_m_BT)
    e_BTC = jnp.exp(z_BTC - new_m_BT[..., None])
    s_BT = s_BT * decay_BT + jnp.sum(e_BTC, axis=-1)
    w_BT = w_BT * decay_BT + jnp.sum(e_BTC * z_BTC, axis=-1)
    return (new_m_BT, s_BT, w_BT), None

  B, T = targets_BT.shape
  init = (jnp.full((B, T), layers.MASKED, jnp.float32), jnp.zeros(
      (B, T), jnp.float32), jnp.zeros((B, T), jnp.float32))
  (m_BT, s_BT, w_BT), _ = jax.lax.scan(chunk, init, (head_nDC, valid_nC))
  lse_BT = m_BT + jnp.log(s_BT)
  target_DBT = jnp.take(head_DV, targets_BT, axis=1)
  target_logit_BT = jnp.einsum('BTD,DBT->BT', hidden_BTD, target_DBT,
                               preferred_element_type=jnp.float32)
  logps_BT = target_logit_BT - lse_BT
  entropy_BT = lse_BT - w_BT / s_BT
  return logps_BT, entropy_BT


def completion_hidden(params, config: ModelConfig, tokens_BL, input_mask_BL, *,
                      completion_start: int, row_sharding=None, replay_BLYW=None):
  """(hidden_BTD, routed): the final-normed hidden states [B, T, D] that predict the completion
  tokens of [prompt | completion] rows (column P + t - 1 predicts token P + t), and a mixture of
  experts' `moe.Routed` (else None). The forward pass of `sequence_logprobs` without its head;
  the arguments are its."""
  chex.assert_rank([tokens_BL, input_mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, input_mask_BL])
  P = completion_start
  L = tokens_BL.shape[1]
  if not 1 <= P < L:
    raise ValueError(f'completion_start={P!r} must satisfy 1 <= completion_start < L={L}')
  replay_YBLW = None if replay_BLYW is None else jnp.moveaxis(replay_BLYW, 2, 0)
  hidden_BLD, _, routed = model_lib.hidden_states(params, config, tokens_BL,
                                                  model_lib.positions_from_mask(input_mask_BL),
                                                  input_mask_BL, row_sharding=row_sharding,
                                                  replay_YBLW=replay_YBLW)
  return hidden_BLD[:, P - 1:L - 1], routed


def sequence_logprobs(params, config: ModelConfig, tokens_BL, input_mask_BL, *,
                      completion_start: int, vocab_chunk: int = 8192, return_hidden: bool = False,
                      row_sharding=None, replay_BLYW=None) -> dict:
  """Per-token log-probs and entropies of the completion region of [prompt | completion].

  tokens_BL = [left-padded prompt (static width P = completion_start) | completion (T)];
  positions = cumsum(input_mask) - 1 (clipped at 0); attention is causal over real keys.
  Completion token t (column P + t) is predicted by the hidden state at column P + t - 1.

  Returns:
    {'logps': [B, T] float32 log p(tokens[:, P+t] | prefix),
     'entropy': [B, T] float32 entropy of that next-token distribution,
     'hidden': [B, T, D] final-normed hidden state that predicted it (iff return_hidden)},
    and for a mixture-of-experts model
    {'experts': [B, T, Y, W] int32, the experts the router itself picks for completion token t
       in each layer (`moe.Routed.experts_BLW`; replayed or not),
     'router_aux': [] float32, the load-balancing loss of the real tokens
       (`moe.load_balancing_loss`)}.
    Values at pad positions are finite but meaningless; mask them.
    ``row_sharding``: as `model_lib.hidden_states` (the rows of every activation over the batch
    axes of a mesh). ``replay_BLYW``: int experts to route each token to in each layer (-1: the
    router's own choice; `jtc.models.moe.route`), or None.
  """
  P = completion_start
  hidden_BTD, routed = completion_hidden(params, config, tokens_BL, input_mask_BL,
                                         completion_start=P, row_sharding=row_sharding,
                                         replay_BLYW=replay_BLYW)
  logps_BT, entropy_BT = token_logprobs(hidden_BTD, model_lib.lm_head_DV(params, config),
                                        tokens_BL[:, P:], vocab_chunk=vocab_chunk)
  out = {'logps': logps_BT, 'entropy': entropy_BT}
  if return_hidden:
    out['hidden'] = hidden_BTD
  if routed is not None:
    out['experts'] = jnp.moveaxis(routed.experts_BLW[:, :, P:], 0, 2)
    out['router_aux'] = moe.load_balancing_loss(routed, input_mask_BL)
  return out
