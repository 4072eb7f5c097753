"""The pieces of one decoder layer, as pure functions of that layer's parameters: RMSNorm,
rotary embeddings (Hugging Face rotate_half layout, optional linear / Llama-3 scaling), the
q/k/v projections with optional qk-norm and biases, grouped-query softmax attention, the SwiGLU
MLP (or the mixture of experts of `jtc.models.moe`) and the pre-norm residual block.
`jtc.models.model` scans them over the stacked layers.

Dimension key (docs/dimensions.md), as `jtc.models.model`: B batch, L tokens, S key slots,
N query heads, K kv heads, Q = N / K, H head dim, D model dim, F mlp dim, W experts per token.
"""

import math

import jax
import jax.numpy as jnp

from jtc.models import lora
from jtc.models import moe
from jtc.models.model_config import ModelConfig

MASKED = -1e30  # finite "minus infinity": a fully masked row softmaxes to uniform, not NaN.


def rms_norm(x, scale, eps: float, dtype):
  """y = x * rsqrt(mean(x^2) + eps) * scale, in float32, cast to `dtype`."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(dtype)


def dense(eqn, x, p, dtype):
  """einsum(eqn, x, kernel) (+ bias) in the compute dtype; + the low-rank term (x A) B of the
  projection's LoRA adapter when it has one (`jtc.models.lora`)."""
  y = jnp.einsum(eqn, x.astype(dtype), p['kernel'].astype(dtype))
  if 'lora_a' in p:
    y = y + lora.low_rank(eqn, x, p, dtype)
  if 'bias' in p:
    y = y + p['bias'].astype(dtype)
  return y


def rope_inv_freq(config: ModelConfig):
  """Inverse frequencies f_j [H/2] float32 of the rotate_half RoPE, scaled per
  `config.rope_scaling` (see `ModelConfig`)."""
  c = config
  inv_freq = c.rope_theta**(-jnp.arange(0, c.head_dim, 2, dtype=jnp.float32) / c.head_dim)
  if c.rope_scaling == 'linear':
    inv_freq = inv_freq / c.rope_factor
  elif c.rope_scaling == 'llama3':
    # Blend weight 1 keeps a frequency, 0 divides it by the factor; it is linear in the number
    # of wavelengths that fit in the original context, between the low and high thresholds.
    wavelengths = 2 * math.pi / inv_freq
    blend = jnp.clip((c.rope_original_max_len / wavelengths - c.rope_low_freq_factor) /
                     (c.rope_high_freq_factor - c.rope_low_freq_factor), 0.0, 1.0)
    inv_freq = (1 - blend) * inv_freq / c.rope_factor + blend * inv_freq
  return inv_freq


def rope_sin_cos(positions_BL, config: ModelConfig):
  """sin/cos [B, L, H] for the rotate_half layout: angle_j = pos * f_j, j < H/2, repeated."""
  angles = positions_BL.astype(jnp.float32)[..., None] * rope_inv_freq(config)  # [B, L, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BLNH, sin_BLH, cos_BLH):
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of H), in float32."""
  x = x_BLNH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]
  return out.astype(x_BLNH.dtype)


def qkv(attn, x_BLD, sin_BLH, cos_BLH, config: ModelConfig):
  """Projections of the normed input: q [B, L, N, H], k and v [B, L, K, H] (RoPE on q, k)."""
  c = config
  q_BLNH = dense('BLD,DNH->BLNH', x_BLD, attn['q'], c.jnp_dtype)
  k_BLKH = dense('BLD,DKH->BLKH', x_BLD, attn['k'], c.jnp_dtype)
  v_BLKH = dense('BLD,DKH->BLKH', x_BLD, attn['v'], c.jnp_dtype)
  if c.qk_norm:
    q_BLNH = rms_norm(q_BLNH, attn['q_norm']['scale'], c.norm_eps, c.jnp_dtype)
    k_BLKH = rms_norm(k_BLKH, attn['k_norm']['scale'], c.norm_eps, c.jnp_dtype)
  return apply_rope(q_BLNH, sin_BLH, cos_BLH), apply_rope(k_BLKH, sin_BLH, cos_BLH), v_BLKH


def mlp(mlp, x_BLD, config: ModelConfig):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  dt = config.jnp_dtype
  gate_BLF = dense('BLD,DF->BLF', x_BLD, mlp['gate'], dt)
  up_BLF = dense('BLD,DF->BLF', x_BLD, mlp['up'], dt)
  return dense('BLF,FD->BLD', jax.nn.silu(gate_BLF) * up_BLF, mlp['down'], dt)


def softmax_attention(q_BLNH, k_BKSH, v_BKSH, allowed_BLS, config: ModelConfig):
  """softmax(q k^T / sqrt(H) masked to `allowed`) v over S key slots: [B, L, N, H]."""
  c = config
  B, L, N, H = q_BLNH.shape
  K = k_BKSH.shape[1]
  q_BLKQH = q_BLNH.reshape(B, L, K, N // K, H)
  scores_BKQLS = jnp.einsum('BLKQH,BKSH->BKQLS', q_BLKQH, k_BKSH.astype(c.jnp_dtype),
                            preferred_element_type=jnp.float32) / math.sqrt(H)
  scores_BKQLS = jnp.where(allowed_BLS[:, None, None], scores_BKQLS, MASKED)
  probs_BKQLS = jax.nn.softmax(scores_BKQLS, axis=-1).astype(c.jnp_dtype)
  out_BLKQH = jnp.einsum('BKQLS,BKSH->BLKQH', probs_BKQLS, v_BKSH.astype(c.jnp_dtype))
  return out_BLKQH.reshape(B, L, N, H)


def feed_forward(p, x_BLD, config: ModelConfig, *, mask_BL=None, replay_BLW=None):
  """The block's MLP: (y_BLD, None), or with a router in ``p`` the mixture of experts
  (`jtc.models.moe.feed_forward`: its tokens counted by ``mask_BL``, ``replay_BLW`` replayed):
  (y_BLD, `moe.Routed`)."""
  if 'router' in p:
    return moe.feed_forward(p, x_BLD, config, mask_BL=mask_BL, replay_BLW=replay_BLW)
  return mlp(p, x_BLD, config), None


def block(layer, x_BLD, sin_BLH, cos_BLH, attend, config: ModelConfig, *, mask_BL=None,
          replay_BLW=None):
  """Pre-norm residual block: x += o(attend(q, k, v)); x += feed_forward(norm(x)).

  `attend(q_BLNH, k_BLKH, v_BLKH) -> (out_BLNH, aux)` is the attention of this call (plain
  causal, through a `KVCache`, or grouped decode). Returns (x, aux, routed): ``routed`` is the
  `moe.Routed` of a mixture-of-experts layer (``mask_BL``, ``replay_BLW``: `feed_forward`), else
  None.
  """
  c = config
  h_BLD = rms_norm(x_BLD, layer['attn_norm']['scale'], c.norm_eps, c.jnp_dtype)
  q_BLNH, k_BLKH, v_BLKH = qkv(layer['attn'], h_BLD, sin_BLH, cos_BLH, c)
  out_BLNH, aux = attend(q_BLNH, k_BLKH, v_BLKH)
  x_BLD = x_BLD + dense('BLNH,NHD->BLD', out_BLNH, layer['attn']['o'], c.jnp_dtype)
  h_BLD = rms_norm(x_BLD, layer['mlp_norm']['scale'], c.norm_eps, c.jnp_dtype)
  y_BLD, routed = feed_forward(layer['mlp'], h_BLD, c, mask_BL=mask_BL, replay_BLW=replay_BLW)
  return x_BLD + y_BLD, aux, routed
