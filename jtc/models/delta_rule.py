"""The gated delta rule of Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", arXiv 2412.06464, Sec. 3), in two forms that agree to float32
round-off: the recurrent form (one token at a time: decoding) and the chunked parallel form
(training and scoring). `jtc.models.gated_deltanet` is the layer around it.

Per value head, a state S [H, H'] (key dim x value dim; transposed from the paper's S) is
decayed, corrected towards the new value, and read by the query:

  S_t = a_t S_{t-1} + k_t d_t^T,   d_t = b_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t,

with a_t = exp(g_t) in (0, 1] the decay (g_t <= 0, log space), b_t in (0, 1) the write strength
(the paper's S_t = S_{t-1} a_t (I - b_t k_t k_t^T) + b_t v_t k_t^T, transposed).

Chunked form (the paper's Sec. 3.3, the WY / UT representation): for a chunk of C tokens entered
with state S_0, let c_i = g_1 + ... + g_i (cumulated within the chunk). Unrolling the recursion,

  d = (I + A)^{-1} (b v - b e^c k S_0) = u - w S_0,   A_ij = b_i (k_i . k_j) e^{c_i - c_j} (j < i),
  o_i = e^{c_i} q_i^T S_0 + sum_{j <= i} e^{c_i - c_j} (q_i . k_j) d_j,
  S_C = e^{c_C} S_0 + sum_j e^{c_C - c_j} k_j d_j^T,

so everything but S_0 is computed for all chunks at once (a unit lower-triangular solve per
chunk), and a `jax.lax.scan` carries S across the n chunks. Every exponent is <= 0, so nothing
overflows. Both forms run in float32 whatever the compute dtype (the state accumulates in f32).

Padding: a token with k = v = 0 and b = 0, g = 0 leaves S unchanged (the chunked form pads the
sequence to whole chunks that way); the layer zeroes the input of pad tokens (as Hugging Face),
so a left-padded row enters its first real token with S = 0.

Dimension key (docs/dimensions.md): B batch, L tokens, C chunk length, N value heads (each reads
the key head it is grouped with, already repeated here), H head dim: the key head dim of q and k,
the value head dim of v and o (the two may differ; the state is [B, N, H, H], key by value, and
the einsum strings call the value head dim O).
"""

import jax
import jax.numpy as jnp

f32 = lambda x: x.astype(jnp.float32)


def step(state_BNHH, q_BNH, k_BNH, v_BNH, g_BN, beta_BN):
  """One token of the recurrence: (o_BNH, the new state), float32."""
  state_BNHH = state_BNHH * jnp.exp(f32(g_BN))[..., None, None]
  read_BNH = jnp.einsum('BNHO,BNH->BNO', state_BNHH, f32(k_BNH))
  delta_BNH = f32(beta_BN)[..., None] * (f32(v_BNH) - read_BNH)
  state_BNHH = state_BNHH + jnp.einsum('BNH,BNO->BNHO', f32(k_BNH), delta_BNH)
  return jnp.einsum('BNHO,BNH->BNO', state_BNHH, f32(q_BNH)), state_BNHH


def recurrent(q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN, state_BNHH):
  """The recurrent form over L tokens (a `jax.lax.scan` of `step`): (o_BLNH, final state)."""

  def body(state_BNHH, xs):
    o_BNH, state_BNHH = step(state_BNHH, *xs)
    return state_BNHH, o_BNH

  to_L = lambda x: jnp.moveaxis(x, 1, 0)
  state_BNHH, o_LBNH = jax.lax.scan(body, f32(state_BNHH),
                                    tuple(map(to_L, (q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN))))
  return jnp.moveaxis(o_LBNH, 0, 1), state_BNHH


def _chunk_terms(q_BCNH, k_BCNH, v_BCNH, g_BCN, beta_BCN):
  """What one chunk needs besides its entry state (module docstring): u, w, the decayed query
  and key, the within-chunk scores (q_i . k_j) e^{c_i - c_j} (j <= i) and e^{c_C}."""
  C = q_BCNH.shape[1]
  c_BCN = jnp.cumsum(g_BCN, axis=1)
  causal_CC = jnp.tril(jnp.ones((C, C), bool))
  # e^{c_i - c_j} on and below the diagonal, 0 above (masked before the exponential).
  gap_BNCC = c_BCN.transpose(0, 2, 1)[..., :, None] - c_BCN.transpose(0, 2, 1)[..., None, :]
  decay_BNCC = jnp.exp(jnp.where(causal_CC, gap_BNCC, -jnp.inf))
  kk_BNCC = jnp.einsum('BINH,BJNH->BNIJ', k_BCNH, k_BCNH)
  strict_CC = jnp.tril(jnp.ones((C, C), bool), -1)
  a_BNCC = jnp.where(strict_CC, beta_BCN.transpose(0, 2, 1)[..., None] * kk_BNCC * decay_BNCC, 0.0)
  # (I + A) [u, w] = [b v, b e^c k]: one unit lower-triangular solve for both right-hand sides.
  rhs = jnp.concatenate(
      [(beta_BCN[..., None] * v_BCNH).transpose(0, 2, 1, 3),
       (beta_BCN[..., None] * jnp.exp(c_BCN)[..., None] * k_BCNH).transpose(0, 2, 1, 3)], axis=-1)
  eye_CC = jnp.eye(C, dtype=a_BNCC.dtype)
  sol = jax.lax.linalg.triangular_solve(a_BNCC + eye_CC, rhs, left_side=True, lower=True,
                                        unit_diagonal=True)
  O = v_BCNH.shape[-1]
  u_BNCH, w_BNCH = sol[..., :O], sol[..., O:]
  scores_BNCC = jnp.einsum('BINH,BJNH->BNIJ', q_BCNH, k_BCNH) * decay_BNCC
  q_decayed_BNCH = (jnp.exp(c_BCN)[..., None] * q_BCNH).transpose(0, 2, 1, 3)
  k_tail_BNCH = (jnp.exp(c_BCN[:, -1:] - c_BCN)[..., None] * k_BCNH).transpose(0, 2, 1, 3)
  return u_BNCH, w_BNCH, q_decayed_BNCH, k_tail_BNCH, scores_BNCC, jnp.exp(c_BCN[:, -1])


def _chunk_step(state_BNHH, terms):
  """One chunk from its entry state: (the chunk's o_BNCH, its exit state)."""
  u_BNCH, w_BNCH, q_decayed_BNCH, k_tail_BNCH, scores_BNCC, end_decay_BN = terms
  d_BNCH = u_BNCH - jnp.einsum('BNCH,BNHO->BNCO', w_BNCH, state_BNHH)
  o_BNCH = (jnp.einsum('BNCH,BNHO->BNCO', q_decayed_BNCH, state_BNHH) +
            jnp.einsum('BNIJ,BNJO->BNIO', scores_BNCC, d_BNCH))
  state_BNHH = (end_decay_BN[..., None, None] * state_BNHH +
                jnp.einsum('BNCH,BNCO->BNHO', k_tail_BNCH, d_BNCH))
  return state_BNHH, o_BNCH


def chunked(q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN, state_BNHH, *, chunk: int):
  """The chunked parallel form (module docstring): (o_BLNH float32, final state float32).

  L need not be a multiple of ``chunk``: the tail is padded with tokens that leave the state
  unchanged (k = v = 0, b = g = 0) and their outputs dropped."""
  B, L, N, H = q_BLNH.shape
  O = v_BLNH.shape[-1]
  C = min(chunk, L)
  pad = -L % C
  n = (L + pad) // C
  # [B, L, ...] -> [n, B, C, ...]: the chunk axis leads, for the vmap and the scan.
  split = lambda x: jnp.moveaxis(
      jnp.pad(f32(x), [(0, 0), (0, pad)] + [(0, 0)] *
              (x.ndim - 2)).reshape(B, n, C, *x.shape[2:]), 1, 0)
  terms = jax.vmap(_chunk_terms)(*map(split, (q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN)))
  state_BNHH, o_chunks = jax.lax.scan(_chunk_step, f32(state_BNHH), terms)  # [n, B, N, C, O]
  o_BLNH = o_chunks.transpose(1, 0, 3, 2, 4).reshape(B, n * C, N, O)
  return o_BLNH[:, :L], state_BNHH
