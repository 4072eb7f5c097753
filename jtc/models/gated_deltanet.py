"""Gated DeltaNet: the linear-attention token mixer of Qwen3.5 and Qwen3-Next (the layers whose
`ModelConfig.layer_types` entry is 'linear_attention'), as Hugging Face's
`Qwen3_5GatedDeltaNet` defines it, in jtc's own JAX.

For a normed input x (pad tokens zeroed first, so they carry nothing into the state):

  q, k = silu(conv(x W_q)), silu(conv(x W_k))      K key heads of dim H
  v    = silu(conv(x W_v))                          N = K * Q value heads of dim Hv
  q <- q / (|q| sqrt(H)),  k <- k / |k|             (L2 norms, eps 1e-6 inside the root)
  b = sigmoid(x W_b),  g = -exp(a_log) softplus(x W_a + dt_bias)   per value head
  o = delta rule(q, k, v, g, b)                     (`jtc.models.delta_rule`; value head n reads
                                                     key head n // Q)
  out = (rmsnorm(o) * w_norm * silu(x W_z)) W_o     (the gated RMSNorm, per value head)

``conv`` is a causal depthwise convolution of width W = `linear_conv_width` over time,
y_t = sum_w kernel[w] x_{t-W+1+w}, on each channel of q, k and v. The chunked form runs for a
whole sequence (training, scoring, prefill), the recurrent form for decoding; `LinearState` is
what a row carries between calls: the convolutions' last W - 1 inputs and the delta rule's
float32 state, constant in size whatever the context.

Parameters of one layer (the 'linear_attn' stack of `jtc.models.layer_types`; HF names)::

  {'q': {'kernel': [D, K, H]}, 'k': {'kernel': [D, K, H]}, 'v': {'kernel': [D, N, Hv]}  in_proj_qkv
   'z': {'kernel': [D, N, Hv]}, 'beta': {'kernel': [D, N]}, 'decay': {'kernel': [D, N]},
                                                              in_proj_z, in_proj_b, in_proj_a
   'conv_q': {'kernel': [W, K, H]}, 'conv_k': ..., 'conv_v': {'kernel': [W, N, Hv]}   conv1d
   'a_log': [N], 'dt_bias': [N], 'norm': {'scale': [Hv]}, 'o': {'kernel': [N, Hv, D]}}  out_proj

Dimension key (docs/dimensions.md): B batch, L tokens, D model dim, K key heads, H key head
dim, N value heads, Q = N / K; Hv is the value head dim (H in shape suffixes: v_BLNH, the state
ssm_BNHH is key by value).
"""

import functools
import math

import flax
import jax
import jax.numpy as jnp

from jtc.models import delta_rule
from jtc.models import layers
from jtc.models.model_config import ModelConfig

L2_EPS = 1e-6  # inside the root of the q/k L2 norms (Hugging Face's `l2norm`)

# Logical axes of the parameters, by their path below 'linear_attn' (`model.param_logical_axes`).
PARAM_AXES = {
    ('q', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('k', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('v', 'kernel'): ('embed', 'heads', 'head_dim'),
    ('z', 'kernel'): ('embed', 'heads', 'head_dim'),
    ('beta', 'kernel'): ('embed', 'heads'),
    ('decay', 'kernel'): ('embed', 'heads'),
    ('conv_q', 'kernel'): (None, 'kv_heads', 'head_dim'),
    ('conv_k', 'kernel'): (None, 'kv_heads', 'head_dim'),
    ('conv_v', 'kernel'): (None, 'heads', 'head_dim'),
    ('a_log',): ('heads',),
    ('dt_bias',): ('heads',),
    ('norm', 'scale'): ('head_dim',),
    ('o', 'kernel'): ('heads', 'head_dim', 'embed'),
}


@flax.struct.dataclass
class LinearState:
  """What a linear-attention layer carries from one call to the next, per row.

  Attributes (W = `linear_conv_width`):
    conv_q, conv_k: [B, W - 1, K, H], the last W - 1 inputs of the q / k convolutions.
    conv_v: [B, W - 1, N, Hv] (Hv the value head dim).
    ssm_BNHH: float32, the delta rule's state.
  """
  conv_q: jax.Array
  conv_k: jax.Array
  conv_v: jax.Array
  ssm_BNHH: jax.Array


# Logical axes of a `LinearState` stacked over the linear layers ([Y, B, ...]).
STATE_AXES = LinearState(conv_q=('layers', 'batch', None, 'kv_heads', 'head_dim'),
                         conv_k=('layers', 'batch', None, 'kv_heads', 'head_dim'),
                         conv_v=('layers', 'batch', None, 'heads', 'head_dim'),
                         ssm_BNHH=('layers', 'batch', 'heads', 'head_dim', None))


def dims(config: ModelConfig):
  """(K, H, N, Hv, W) of the linear-attention layers (Hv: the value head dim)."""
  c = config
  return (c.linear_n_k_heads, c.linear_k_head_dim, c.linear_n_v_heads, c.linear_v_head_dim,
          c.linear_conv_width)


def init_state(config: ModelConfig, batch_size: int) -> LinearState:
  """The state before the first token: zero history and a zero delta-rule state."""
  K, H, N, O, W = dims(config)
  zeros = lambda *shape: jnp.zeros((batch_size, *shape), config.jnp_dtype)
  return LinearState(conv_q=zeros(W - 1, K, H), conv_k=zeros(W - 1, K, H),
                     conv_v=zeros(W - 1, N, O), ssm_BNHH=jnp.zeros((batch_size, N, H, O),
                                                                   jnp.float32))


def check_tensor_axis(p, tensor: int) -> None:
  """The tensor-parallel axis must divide the key and value heads of the linear-attention
  parameters ``p`` (stacked or not): a ValueError naming both, before any compute."""
  K, N = p['conv_q']['kernel'].shape[-2], p['a_log'].shape[-1]
  if K % tensor or N % tensor:
    raise ValueError(f'config.mesh.tensor={tensor} does not divide the Gated DeltaNet heads '
                     f'(ModelConfig.linear_n_k_heads={K}, linear_n_v_heads={N}); choose a '
                     'tensor axis that divides both')


def init_params(config: ModelConfig, key) -> dict:
  """One layer's parameters: kernels ~ N(0, 1/fan_in), the convolution's ~ N(0, 1/W), the
  decay rates A = exp(a_log) ~ U(0.01, 16) and dt_bias = 1 (Hugging Face's initialisation of
  the gates), the norm's scale 1."""
  K, H, N, O, W = dims(config)
  D, dt = config.d_model, config.jnp_param_dtype
  ks = jax.random.split(key, 11)
  normal = lambda k, shape, fan_in: (jax.random.normal(k, shape, dt) * jnp.asarray(
      1 / math.sqrt(fan_in), dt))
  kernel = lambda k, shape, fan_in: {'kernel': normal(k, shape, fan_in)}
  return {
      'q': kernel(ks[0], (D, K, H), D),
      'k': kernel(ks[1], (D, K, H), D),
      'v': kernel(ks[2], (D, N, O), D),
      'z': kernel(ks[3], (D, N, O), D),
      'beta': kernel(ks[4], (D, N), D),
      'decay': kernel(ks[5], (D, N), D),
      'conv_q': kernel(ks[6], (W, K, H), W),
      'conv_k': kernel(ks[7], (W, K, H), W),
      'conv_v': kernel(ks[8], (W, N, O), W),
      'a_log': jnp.log(jax.random.uniform(ks[9], (N,), jnp.float32, 0.01, 16.0)).astype(dt),
      'dt_bias': jnp.ones((N,), dt),
      'norm': {
          'scale': jnp.ones((O,), dt)
      },
      'o': kernel(ks[10], (N, O, D), N * O),
  }


def causal_conv(x, kernel, history):
  """silu of the causal depthwise convolution of ``x`` [B, L, ...] (module docstring) that sees
  ``history`` [B, W - 1, ...] (the inputs before x) first; float32 sums, the input's dtype out.
  Returns (y [B, L, ...], the new history: the last W - 1 inputs)."""
  W, L = kernel.shape[0], x.shape[1]
  full = jnp.concatenate([history.astype(x.dtype), x], axis=1)  # [B, W - 1 + L, ...]
  y = sum(delta_rule.f32(kernel[w]) * delta_rule.f32(full[:, w:w + L]) for w in range(W))
  return jax.nn.silu(y).astype(x.dtype), full[:, L:]


def l2_normalize(x):
  """x / sqrt(sum(x^2) + eps) over the last axis, in float32."""
  x = delta_rule.f32(x)
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + L2_EPS)


def gated_rms_norm(o_BLNH, z_BLNH, scale_H, eps: float, dtype):
  """rmsnorm(o) * scale * silu(z) per value head, in float32, cast to ``dtype``."""
  normed = layers.rms_norm(o_BLNH, scale_H, eps, jnp.float32)
  return (normed * jax.nn.silu(delta_rule.f32(z_BLNH))).astype(dtype)


def mix(p, h_BLD, mask_BL, config: ModelConfig, state: LinearState | None = None, *,
        form: str = 'chunked'):
  """The mixer on L tokens of B rows: (out_BLD in the compute dtype, the `LinearState` after
  them).

  Args:
    p: one layer's parameters (module docstring).
    h_BLD: the normed input.
    mask_BL: 1 on real tokens; pads are zeroed before the projections (Hugging Face's
      `apply_mask_to_padding_states`), so a left-padded row starts from a zero state.
    state: the rows' state before these tokens (None: `init_state`).
    form: 'chunked' (`delta_rule.chunked`, chunks of `linear_chunk`) or 'recurrent'.
  """
  c = config
  dt = c.jnp_dtype
  B, L, _ = h_BLD.shape
  K, H, N, O, _ = dims(c)
  state = init_state(c, B) if state is None else state
  h_BLD = h_BLD * mask_BL[..., None].astype(h_BLD.dtype)
  q_BLKH, conv_q = causal_conv(layers.dense('BLD,DKH->BLKH', h_BLD, p['q'], dt),
                               p['conv_q']['kernel'], state.conv_q)
  k_BLKH, conv_k = causal_conv(layers.dense('BLD,DKH->BLKH', h_BLD, p['k'], dt),
                               p['conv_k']['kernel'], state.conv_k)
  v_BLNH, conv_v = causal_conv(layers.dense('BLD,DNO->BLNO', h_BLD, p['v'], dt),
                               p['conv_v']['kernel'], state.conv_v)
  z_BLNH = layers.dense('BLD,DNO->BLNO', h_BLD, p['z'], dt)
  beta_BLN = jax.nn.sigmoid(delta_rule.f32(layers.dense('BLD,DN->BLN', h_BLD, p['beta'], dt)))
  a_BLN = delta_rule.f32(layers.dense('BLD,DN->BLN', h_BLD, p['decay'], dt))
  g_BLN = -jnp.exp(delta_rule.f32(p['a_log'])) * jax.nn.softplus(a_BLN +
                                                                 delta_rule.f32(p['dt_bias']))
  # Value head n reads key head n // Q (Hugging Face's repeat_interleave).
  to_values = lambda x_BLKH: jnp.repeat(x_BLKH, N // K, axis=2)
  q_BLNH = to_values(l2_normalize(q_BLKH) / math.sqrt(H))
  k_BLNH = to_values(l2_normalize(k_BLKH))
  if form == 'chunked':
    rule = functools.partial(delta_rule.chunked, chunk=c.linear_chunk)
  elif form == 'recurrent':
    rule = delta_rule.recurrent
  else:
    raise ValueError(f"gated_deltanet.mix: form={form!r} is not one of ['chunked', 'recurrent']")
  o_BLNH, ssm_BNHH = rule(q_BLNH, k_BLNH, v_BLNH, g_BLN, beta_BLN, state.ssm_BNHH)
  o_BLNH = gated_rms_norm(o_BLNH, z_BLNH, p['norm']['scale'], c.norm_eps, dt)
  out_BLD = layers.dense('BLNO,NOD->BLD', o_BLNH, p['o'], dt)
  return out_BLD, LinearState(conv_q=conv_q, conv_k=conv_k, conv_v=conv_v, ssm_BNHH=ssm_BNHH)
