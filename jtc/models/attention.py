"""Causal self-attention over padded rows without [L, S] scores: the implementations the trunk
(training, behaviour, reference and prefill passes) chooses from by `ModelConfig.attention`.

  'dense'      `layers.softmax_attention`: the [B, K, Q, L, S] scores at once (the reference);
  'blockwise'  an online softmax over key blocks in pure JAX (FlashAttention-2, Dao 2023,
               Alg. 1 forward and Alg. 2 backward): memory O(L H) per head instead of O(L S); the
               backward recomputes each block's probabilities from the saved log-sum-exp
               (`jax.custom_vjp`), so nothing of size L x S is stored either way;
  'splash'     the Pallas TPU splash-attention kernel (TPU only).
`resolve(name, platform)` maps 'auto' to one of them for the platform that will run the program
(the planner's target, the trainer's devices), never the host's default backend.

Query l may see key s iff s <= l and mask_BL[b, s] (keys are the L tokens themselves). A query
that sees no key at all (left padding) gets a finite, meaningless output, as in 'dense'.

Dimension key (docs/dimensions.md): B batch, L tokens, C block of L, n = L / C blocks, N query heads, K kv heads,
Q = N / K, H head dim.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import layers
from jtc.models.model_config import ATTENTIONS

AUTO = {'cpu': 'dense', 'tpu': 'blockwise', 'gpu': 'blockwise', 'cuda': 'blockwise'}
BLOCK = 512  # C: query and key rows per block


def resolve(name: str, platform: str) -> str:
  """'auto' -> the implementation for ``platform`` ('cpu', 'tpu', 'gpu'); others unchanged."""
  if name == 'auto':
    if platform not in AUTO:
      raise ValueError(f'attention: no automatic choice for platform {platform!r}; known: '
                       f'{sorted(AUTO)}')
    return AUTO[platform]
  if name not in ATTENTIONS:
    raise ValueError(f"attention={name!r} is not one of {['auto', *ATTENTIONS]}")
  return name


def _acc(x):
  """The accumulation dtype: float32, or float64 for float64 inputs."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _pairs(n):
  """The (query block i, key block j <= i) pairs of a causal n x n block grid, [n(n+1)/2] each."""
  i, j = np.tril_indices(n)
  return jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32)


def _block_scores(q_BCKQH, k_BCKH, mask_BC, i, j, C):
  """Scaled, masked float32 scores [B, K, Q, C, C] of query block i against key block j."""
  H = q_BCKQH.shape[-1]
  s_BKQCS = jnp.einsum('BCKQH,BSKH->BKQCS', q_BCKQH, k_BCKH,
                       preferred_element_type=_acc(q_BCKQH)) / math.sqrt(H)
  causal_CS = (i * C + jnp.arange(C))[:, None] >= (j * C + jnp.arange(C))[None, :]
  allowed_BCS = causal_CS[None] & mask_BC[:, None, :]
  return jnp.where(allowed_BCS[:, None, None], s_BKQCS, layers.MASKED)


def _slice(x, b, C, axis):
  return jax.lax.dynamic_slice_in_dim(x, b * C, C, axis=axis)


def _update(x, value, b, C, axis):
  return jax.lax.dynamic_update_slice_in_dim(x, value.astype(x.dtype), b * C, axis=axis)


def _forward(q_BLKQH, k_BLKH, v_BLKH, mask_BL, C):
  """(out_BLKQH float32, lse_BKQL): the online softmax over the causal block pairs."""
  B, L, K, Q, H = q_BLKQH.shape
  acc = _acc(q_BLKQH)
  init = (jnp.full((B, K, Q, L), layers.MASKED, acc), jnp.zeros(
      (B, K, Q, L), acc), jnp.zeros((B, L, K, Q, H), acc))

  def step(carry, ij):
    m_BKQL, l_BKQL, o_BLKQH = carry
    i, j = ij
    s_BKQCS = _block_scores(_slice(q_BLKQH, i, C, 1), _slice(k_BLKH, j, C, 1),
                            _slice(mask_BL, j, C, 1), i, j, C)
    m_old = _slice(m_BKQL, i, C, 3)
    m_new = jnp.maximum(m_old, jnp.max(s_BKQCS, axis=-1))
    p_BKQCS = jnp.exp(s_BKQCS - m_new[..., None])
    decay = jnp.exp(m_old - m_new)
    l_new = _slice(l_BKQL, i, C, 3) * decay + jnp.sum(p_BKQCS, axis=-1)
    pv_BCKQH = jnp.einsum('BKQCS,BSKH->BCKQH', p_BKQCS.astype(v_BLKH.dtype),
                          _slice(v_BLKH, j, C, 1), preferred_element_type=acc)
    o_new = _slice(o_BLKQH, i, C, 1) * decay.transpose(0, 3, 1, 2)[..., None] + pv_BCKQH
    return (_update(m_BKQL, m_new, i, C, 3), _update(l_BKQL, l_new, i, C,
                                                     3), _update(o_BLKQH, o_new, i, C, 1)), None

  (m_BKQL, l_BKQL, o_BLKQH), _ = jax.lax.scan(step, init, _pairs(L // C))
  out_BLKQH = o_BLKQH / l_BKQL.transpose(0, 3, 1, 2)[..., None]
  return out_BLKQH, m_BKQL + jnp.log(l_BKQL)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q_BLKQH, k_BLKH, v_BLKH, mask_BL, C):
  out_BLKQH, _ = _forward(q_BLKQH, k_BLKH, v_BLKH, mask_BL, C)
  return out_BLKQH.astype(q_BLKQH.dtype)


def _flash_fwd(q_BLKQH, k_BLKH, v_BLKH, mask_BL, C):
  out_BLKQH, lse_BKQL = _forward(q_BLKQH, k_BLKH, v_BLKH, mask_BL, C)
  out_BLKQH = out_BLKQH.astype(q_BLKQH.dtype)
  return out_BLKQH, (q_BLKQH, k_BLKH, v_BLKH, mask_BL, out_BLKQH, lse_BKQL)


def _flash_bwd(C, residuals, dout_BLKQH):
  """FlashAttention-2's backward: per block pair, p = exp(s - lse) recomputed,
  dv += p^T do, ds = p (do v^T - rowsum(do o)), dq += ds k / sqrt(H), dk += ds^T q / sqrt(H)."""
  q_BLKQH, k_BLKH, v_BLKH, mask_BL, out_BLKQH, lse_BKQL = residuals
  H = q_BLKQH.shape[-1]
  acc = _acc(q_BLKQH)
  dout32 = dout_BLKQH.astype(acc)
  delta_BKQL = jnp.einsum('BLKQH,BLKQH->BKQL', dout32, out_BLKQH.astype(acc))
  init = (jnp.zeros(q_BLKQH.shape, acc), jnp.zeros(k_BLKH.shape, acc), jnp.zeros(v_BLKH.shape, acc))
  L = q_BLKQH.shape[1]

  def step(carry, ij):
    dq, dk, dv = carry
    i, j = ij
    q_i, k_j, v_j = _slice(q_BLKQH, i, C, 1), _slice(k_BLKH, j, C, 1), _slice(v_BLKH, j, C, 1)
    s_BKQCS = _block_scores(q_i, k_j, _slice(mask_BL, j, C, 1), i, j, C)
    p_BKQCS = jnp.exp(s_BKQCS - _slice(lse_BKQL, i, C, 3)[..., None])
    do_i = _slice(dout32, i, C, 1)
    dv_j = jnp.einsum('BKQCS,BCKQH->BSKH', p_BKQCS, do_i)
    dp_BKQCS = jnp.einsum('BCKQH,BSKH->BKQCS', do_i, v_j.astype(acc))
    ds_BKQCS = p_BKQCS * (dp_BKQCS - _slice(delta_BKQL, i, C, 3)[..., None]) / math.sqrt(H)
    dq_i = jnp.einsum('BKQCS,BSKH->BCKQH', ds_BKQCS, k_j.astype(acc))
    dk_j = jnp.einsum('BKQCS,BCKQH->BSKH', ds_BKQCS, q_i.astype(acc))
    return (_update(dq,
                    _slice(dq, i, C, 1) + dq_i, i, C,
                    1), _update(dk,
                                _slice(dk, j, C, 1) + dk_j, j, C,
                                1), _update(dv,
                                            _slice(dv, j, C, 1) + dv_j, j, C, 1)), None

  (dq, dk, dv), _ = jax.lax.scan(step, init, _pairs(L // C))
  return dq.astype(q_BLKQH.dtype), dk.astype(k_BLKH.dtype), dv.astype(v_BLKH.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, *, block: int = BLOCK):
  """Causal grouped-query attention over key blocks with an online softmax: [B, L, N, H].

  Equal to `layers.softmax_attention` with allowed = causal & mask (outputs and gradients, up
  to float rounding) on every query that sees at least one key. L is padded up to whole blocks
  of C = min(block, L) rows (pad keys masked)."""
  B, L, N, H = q_BLNH.shape
  K = k_BLKH.shape[2]
  C = min(block, L)
  pad = -L % C
  padded = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  q_BLKQH = padded(q_BLNH).reshape(B, L + pad, K, N // K, H)
  out = _flash(q_BLKQH,
               padded(k_BLKH).astype(q_BLNH.dtype),
               padded(v_BLKH).astype(q_BLNH.dtype), padded(mask_BL.astype(bool)), C)
  return out[:, :L].reshape(B, L, N, H)


def dense_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, config):
  """`layers.softmax_attention` with allowed = causal & mask (the [L, L] scores at once)."""
  L = q_BLNH.shape[1]
  allowed_BLS = mask_BL.astype(bool)[:, None, :] & jnp.tril(jnp.ones((L, L), bool))[None]
  to_BKLH = lambda x: x.transpose(0, 2, 1, 3)
  return layers.softmax_attention(q_BLNH, to_BKLH(k_BLKH), to_BKLH(v_BLKH), allowed_BLS, config)


def splash_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL):
  """The Pallas TPU splash-attention kernel: causal mask, padding as segment ids (real 1, pad
  0, so a real query sees real keys only), grouped-query heads, vmapped over B."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # pylint: disable=import-outside-toplevel
  B, L, N, H = q_BLNH.shape
  K = k_BLKH.shape[2]
  mask = sm.MultiHeadMask([sm.CausalMask((L, L)) for _ in range(N)])
  block = min(BLOCK, L)
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                        block_kv_dq=block)
  kernel = sk.make_splash_mha_single_device(mask, block_sizes=sizes)
  seg = mask_BL.astype(jnp.int32)
  q_BNLH = q_BLNH.transpose(0, 2, 1, 3) / math.sqrt(H)
  rep = lambda x: jnp.repeat(x.transpose(0, 2, 1, 3), N // K, axis=1)  # [B, N, L, H]

  def one(q, k, v, s):
    return kernel(q, k, v, segment_ids=sk.SegmentIds(q=s, kv=s))

  out_BNLH = jax.vmap(one)(q_BNLH.astype(q_BLNH.dtype), rep(k_BLKH).astype(q_BLNH.dtype),
                           rep(v_BLKH).astype(q_BLNH.dtype), seg)
  return out_BNLH.transpose(0, 2, 1, 3)


def causal_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, config):
  """The trunk's attention by ``config.attention``: [B, L, N, H] in the compute dtype."""
  name = config.attention
  if name == 'dense':
    return dense_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL, config)
  q_BLNH = q_BLNH.astype(config.jnp_dtype)
  if name == 'blockwise':
    return blockwise_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL)
  if name == 'splash':
    return splash_attention(q_BLNH, k_BLKH, v_BLKH, mask_BL)
  raise ValueError(f'ModelConfig.attention={name!r} is not one of {list(ATTENTIONS)}')
