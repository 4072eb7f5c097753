"""The pieces of one decoder layer, as pure functions of that layer's parameters: RMSNorm
(optionally zero-centred weights), rotary embeddings (Hugging Face rotate_half layout, optional
linear / Llama-3 scaling, optionally on the first dimensions of a head only), the q/k/v
projections with optional qk-norm, biases and output gate, grouped-query softmax attention, the
SwiGLU MLP (or the mixture of experts of `jtc.models.moe`) and the pre-norm residual block of
any layer kind (`jtc.models.layer_types`).
`jtc.models.model` scans them over the stacked layers.

Dimension key (docs/dimensions.md), as `jtc.models.model`: B batch, L tokens, S key slots,
N query heads, K kv heads, Q = N / K, H head dim, D model dim, F mlp dim, W experts per token.
"""

import math

import jax
import jax.numpy as jnp

from jtc.models import layer_types
from jtc.models import lora
from jtc.models import moe
from jtc.models.model_config import ModelConfig

MASKED = -1e30  # finite "minus infinity": a fully masked row softmaxes to uniform, not NaN.


def rms_norm(x, scale, eps: float, dtype, zero_centered: bool = False):
  """y = x * rsqrt(mean(x^2) + eps) * scale, in float32, cast to `dtype`; with
  ``zero_centered`` the weight is stored as w = scale - 1 (y = ... * (1 + w), Qwen3.5)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  scale32 = scale.astype(jnp.float32) + (1.0 if zero_centered else 0.0)
  return (y * scale32).astype(dtype)


def norm(x, p, config: ModelConfig):
  """The model's RMSNorm with parameters ``p`` ({'scale': ...}) in the compute dtype."""
  return rms_norm(x, p['scale'], config.norm_eps, config.jnp_dtype, config.norm_zero_centered)


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
  """Inverse frequencies f_j [rotary_dim / 2] float32 of the rotate_half RoPE, scaled per
  `config.rope_scaling` (see `ModelConfig`)."""
  c = config
  rot = c.rotary_dim
  inv_freq = c.rope_theta**(-jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
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
  """sin/cos [B, L, rotary_dim] for the rotate_half layout: angle_j = pos * f_j, j <
  rotary_dim / 2, repeated (rotary_dim = H unless `partial_rotary_factor` < 1)."""
  angles = positions_BL.astype(jnp.float32)[..., None] * rope_inv_freq(config)  # [B, L, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BLNH, sin_BLH, cos_BLH):
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of the rotated part),
  in float32, on the first sin.shape[-1] dimensions of each head (the rest pass through)."""
  x = x_BLNH.astype(jnp.float32)
  rot = sin_BLH.shape[-1]
  x, rest = x[..., :rot], x[..., rot:]
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]
  return jnp.concatenate([out, rest], axis=-1).astype(x_BLNH.dtype)


def qkv(attn, x_BLD, sin_BLH, cos_BLH, config: ModelConfig):
  """Projections of the normed input: q [B, L, N, H], k and v [B, L, K, H] (RoPE on q, k)."""
  c = config
  q_BLNH = dense('BLD,DNH->BLNH', x_BLD, attn['q'], c.jnp_dtype)
  k_BLKH = dense('BLD,DKH->BLKH', x_BLD, attn['k'], c.jnp_dtype)
  v_BLKH = dense('BLD,DKH->BLKH', x_BLD, attn['v'], c.jnp_dtype)
  if c.qk_norm:
    q_BLNH = norm(q_BLNH, attn['q_norm'], c)
    k_BLKH = norm(k_BLKH, attn['k_norm'], c)
  return apply_rope(q_BLNH, sin_BLH, cos_BLH), apply_rope(k_BLKH, sin_BLH, cos_BLH), v_BLKH


def mlp(mlp, x_BLD, config: ModelConfig):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  dt = config.jnp_dtype
  gate_BLF = dense('BLD,DF->BLF', x_BLD, mlp['gate'], dt)
  up_BLF = dense('BLD,DF->BLF', x_BLD, mlp['up'], dt)
  return dense('BLF,FD->BLD', jax.nn.silu(gate_BLF) * up_BLF, mlp['down'], dt)


def feed_forward(p, x_BLD, config: ModelConfig, *, mask_BL=None, replay_BLW=None):
  """The block's MLP: (y_BLD, None), or with a router in ``p`` the mixture of experts
  (`jtc.models.moe.feed_forward`: its tokens counted by ``mask_BL``, ``replay_BLW`` replayed):
  (y_BLD, `moe.Routed`)."""
  if 'router' in p:
    return moe.feed_forward(p, x_BLD, config, mask_BL=mask_BL, replay_BLW=replay_BLW)
  return mlp(p, x_BLD, config), None


# Feed-forward blocks by layer kind (`LayerKind.ffn`): fn(params, normed x_BLD, config, *,
# mask_BL, replay_BLW) -> (y_BLD, aux or None); a non-None aux (a mixture of experts'
# `moe.Routed`) is returned by `block` under the block's stack name.
FFNS = {'mlp': feed_forward, 'moe': moe.feed_forward}


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


def attention_mixer(attn, sin_BLH, cos_BLH, attend, config: ModelConfig):
  """The full-attention token mixer of a block: h -> (o(attend(q, k, v)) [* sigmoid gate], aux).

  `attend(q_BLNH, k_BLKH, v_BLKH) -> (out_BLNH, aux)` is the attention of this call (plain
  causal, through a `KVCache`, or grouped decode). With `attn_output_gate` (Qwen3.5 / Qwen3-Next)
  the attention output is multiplied by sigmoid(h W_g) before the output projection."""
  c = config

  def mixer(h_BLD):
    q_BLNH, k_BLKH, v_BLKH = qkv(attn, h_BLD, sin_BLH, cos_BLH, c)
    out_BLNH, aux = attend(q_BLNH, k_BLKH, v_BLKH)
    if c.attn_output_gate:
      gate_BLNH = dense('BLD,DNH->BLNH', h_BLD, attn['q_gate'], c.jnp_dtype)
      out_BLNH = (out_BLNH.astype(jnp.float32) *
                  jax.nn.sigmoid(gate_BLNH.astype(jnp.float32))).astype(c.jnp_dtype)
    return dense('BLNH,NHD->BLD', out_BLNH, attn['o'], c.jnp_dtype), aux

  return mixer


def block(layer, x_BLD, mixer, config: ModelConfig, kind=None, *, mask_BL=None, replay_BLW=None):
  """Pre-norm residual block of a layer of ``kind`` (`jtc.models.layer_types.LayerKind`; None:
  full attention + MLP): x += mixer(norm(x)); x += ffn(norm(x)).

  ``mixer(h_BLD) -> (out_BLD, aux)`` is the layer's token mixer for this call; ``mask_BL``,
  ``replay_BLW`` go to a mixture of experts (`moe.feed_forward`). Returns (the new x, {stack
  name: aux}) with the mixer's and the feed-forward block's non-None auxiliary outputs (a
  `moe.Routed`) under their parameter stacks' names (what `layer_types.scan_layers` stacks).
  """
  c = config
  kind = kind or layer_types.DENSE
  out_BLD, mixer_aux = mixer(norm(x_BLD, layer['attn_norm'], c))
  x_BLD = x_BLD + out_BLD
  y_BLD, ffn_aux = FFNS[kind.ffn](layer[kind.ffn_stack], norm(x_BLD, layer['mlp_norm'], c), c,
                                  mask_BL=mask_BL, replay_BLW=replay_BLW)
  auxes = ((kind.mixer_stack, mixer_aux), (kind.ffn_stack, ffn_aux))
  return x_BLD + y_BLD, {name: aux for name, aux in auxes if aux is not None}
