"""A frozen copy of the sampler (and of the unrolled, per-layer model under it) as they were
before the stacked-layer model and the shared-prompt decode (commit f924578), kept as an
independent reference: tests check that `jtc.models.sampler.sample` draws the same tokens, masks,
truncation flags and (within float rounding) log-probs for the same key.

It takes parameters in the earlier per-layer layout: pass `jtc.models.model.unstack_layers(params)`.
Only plain RoPE existed then (configs with rope_scaling are rejected). Do not edit: this file
is the "today" the new sampler is compared with (tests/models/test_sampler_reference.py and
`python -m benchmarks.sampler`).
"""

import functools
import math
from typing import Any

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jtc.models.model import ModelConfig

_MASKED = -1e30


def _check(config):
  if config.rope_scaling != 'default':
    raise ValueError('the reference model has plain RoPE only')


@flax.struct.dataclass
class KVCache:
  """Per-layer keys/values (RoPE already applied) for S slots.

  Attributes:
    k: tuple of n_layers arrays [B, S, K, H] in the compute dtype.
    v: tuple of n_layers arrays [B, S, K, H].
    mask_BS: [B, S] bool, True where a slot holds a real (non-pad) token.
    index: [] int32, the next slot to write (shared by the whole batch).
  """
  k: tuple
  v: tuple
  mask_BS: jax.Array
  index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, cache_len: int) -> KVCache:
  """An empty cache of `cache_len` slots."""
  shape = (batch_size, cache_len, config.n_kv_heads, config.head_dim)
  zeros = lambda: jnp.zeros(shape, config.jnp_dtype)
  return KVCache(k=tuple(zeros() for _ in range(config.n_layers)),
                 v=tuple(zeros() for _ in range(config.n_layers)), mask_BS=jnp.zeros(
                     (batch_size, cache_len), bool), index=jnp.zeros((), jnp.int32))


def repeat_cache(cache: KVCache, repeats: int) -> KVCache:
  """Row b -> rows b*repeats ... b*repeats + repeats - 1 (groups contiguous)."""
  rep = lambda x: jnp.repeat(x, repeats, axis=0)
  return KVCache(k=tuple(map(rep, cache.k)), v=tuple(map(rep, cache.v)), mask_BS=rep(cache.mask_BS),
                 index=cache.index)


# ----------------------------------------------------------------------------------------
# Modules.


def _normal_init(fan_in: int):
  return nn.initializers.normal(stddev=1.0 / math.sqrt(fan_in))


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2) + eps) * scale, in float32, cast back to `dtype`."""
  eps: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


class Einsum(nn.Module):
  """y = einsum(eqn, x, kernel) (+ bias); kernel ~ N(0, 1/fan_in)."""
  eqn: str
  kernel_shape: tuple
  fan_in: int
  dtype: Any
  param_dtype: Any
  bias_shape: tuple | None = None

  @nn.compact
  def __call__(self, x):
    kernel = self.param('kernel', _normal_init(self.fan_in), self.kernel_shape, self.param_dtype)
    y = jnp.einsum(self.eqn, x.astype(self.dtype), kernel.astype(self.dtype))
    if self.bias_shape is not None:
      bias = self.param('bias', nn.initializers.zeros, self.bias_shape, self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


def rope_sin_cos(positions_BL, head_dim: int, theta: float):
  """sin/cos [B, L, H] for the rotate_half layout: angle_j = pos * theta^(-2j/H), j < H/2."""
  inv_freq = theta**(-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  angles = positions_BL.astype(jnp.float32)[..., None] * inv_freq  # [B, L, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BLNH, sin_BLH, cos_BLH):
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (halves of H), in float32."""
  x = x_BLNH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x * cos_BLH[:, :, None, :] + rotated * sin_BLH[:, :, None, :]
  return out.astype(x_BLNH.dtype)


class Attention(nn.Module):
  """Grouped-query causal self-attention over the new tokens plus the cache slots."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS):
    c = self.config
    D, N, K, H = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    dense = functools.partial(Einsum, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    q_BLNH = dense('BLD,DNH->BLNH', (D, N, H), D, bias_shape=(N, H) if c.attn_bias else None,
                   name='q')(x_BLD)
    k_BLKH = dense('BLD,DKH->BLKH', (D, K, H), D, bias_shape=(K, H) if c.attn_bias else None,
                   name='k')(x_BLD)
    v_BLKH = dense('BLD,DKH->BLKH', (D, K, H), D, bias_shape=(K, H) if c.attn_bias else None,
                   name='v')(x_BLD)
    if c.qk_norm:
      norm = functools.partial(RMSNorm, eps=c.norm_eps, dtype=c.jnp_dtype,
                               param_dtype=c.jnp_param_dtype)
      q_BLNH = norm(name='q_norm')(q_BLNH)
      k_BLKH = norm(name='k_norm')(k_BLKH)
    q_BLNH = apply_rope(q_BLNH, sin_BLH, cos_BLH)
    k_BLKH = apply_rope(k_BLKH, sin_BLH, cos_BLH)

    if kv is None:  # no cache: the keys are exactly the new tokens, slots 0..L-1.
      k_BSKH, v_BSKH = k_BLKH, v_BLKH
    else:
      k_BSKH = jax.lax.dynamic_update_slice(kv[0], k_BLKH.astype(kv[0].dtype), (0, index, 0, 0))
      v_BSKH = jax.lax.dynamic_update_slice(kv[1], v_BLKH.astype(kv[1].dtype), (0, index, 0, 0))

    B, L = x_BLD.shape[:2]
    S = k_BSKH.shape[1]
    q_BLKRH = q_BLNH.reshape(B, L, K, N // K, H)
    scores_BKRLS = jnp.einsum('BLKRH,BSKH->BKRLS', q_BLKRH, k_BSKH.astype(c.jnp_dtype),
                              preferred_element_type=jnp.float32) / math.sqrt(H)
    query_slot_L = index + jnp.arange(L)
    causal_LS = jnp.arange(S)[None, :] <= query_slot_L[:, None]
    allowed_BLS = key_mask_BS[:, None, :] & causal_LS[None]
    scores_BKRLS = jnp.where(allowed_BLS[:, None, None], scores_BKRLS, _MASKED)
    probs_BKRLS = jax.nn.softmax(scores_BKRLS, axis=-1).astype(c.jnp_dtype)
    out_BLKRH = jnp.einsum('BKRLS,BSKH->BLKRH', probs_BKRLS, v_BSKH.astype(c.jnp_dtype))
    out_BLNH = out_BLKRH.reshape(B, L, N, H)
    y_BLD = dense('BLNH,NHD->BLD', (N, H, D), N * H, name='o')(out_BLNH)
    return y_BLD, (k_BSKH, v_BSKH)


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dense = functools.partial(Einsum, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    gate_BLF = dense('BLD,DF->BLF', (c.d_model, c.d_ff), c.d_model, name='gate')(x_BLD)
    up_BLF = dense('BLD,DF->BLF', (c.d_model, c.d_ff), c.d_model, name='up')(x_BLD)
    return dense('BLF,FD->BLD', (c.d_ff, c.d_model), c.d_ff,
                 name='down')(jax.nn.silu(gate_BLF) * up_BLF)


class Block(nn.Module):
  """Pre-norm residual block: x += attn(norm(x)); x += mlp(norm(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS):
    c = self.config
    norm = functools.partial(RMSNorm, eps=c.norm_eps, dtype=c.jnp_dtype,
                             param_dtype=c.jnp_param_dtype)
    h_BLD, kv = Attention(c, name='attn')(norm(name='attn_norm')(x_BLD), sin_BLH, cos_BLH, kv,
                                          index, key_mask_BS)
    x_BLD = x_BLD + h_BLD
    x_BLD = x_BLD + MLP(c, name='mlp')(norm(name='mlp_norm')(x_BLD))
    return x_BLD, kv


class Embedder(nn.Module):
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embedding = self.param('embedding', _normal_init(c.d_model), (c.vocab_size, c.d_model),
                                c.jnp_param_dtype)

  def __call__(self, tokens_BL):
    return jnp.take(self.embedding, tokens_BL, axis=0).astype(self.config.jnp_dtype)


class Transformer(nn.Module):
  """`__call__(tokens, positions, mask, cache) -> (final-normed hidden [B, L, D], cache)`."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embed = Embedder(c)
    block = nn.remat(Block) if c.remat else Block
    self.layers = [block(c) for _ in range(c.n_layers)]  # named layers_0, layers_1, ...
    self.final_norm = RMSNorm(eps=c.norm_eps, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype)
    if not c.tie_embeddings:
      self.lm_head = Einsum('BLD,DV->BLV', (c.d_model, c.vocab_size), c.d_model, dtype=c.jnp_dtype,
                            param_dtype=c.jnp_param_dtype)

  def __call__(self, tokens_BL, positions_BL, mask_BL, cache: KVCache | None = None):
    c = self.config
    L = tokens_BL.shape[1]
    if cache is None:
      index = 0
      key_mask_BS = mask_BL.astype(bool)
      kvs = [None] * c.n_layers
    else:
      index = cache.index
      key_mask_BS = jax.lax.dynamic_update_slice(cache.mask_BS, mask_BL.astype(bool), (0, index))
      kvs = list(zip(cache.k, cache.v))
    sin_BLH, cos_BLH = rope_sin_cos(positions_BL, c.head_dim, c.rope_theta)
    x_BLD = self.embed(tokens_BL)
    new_kvs = []
    for layer, kv in zip(self.layers, kvs):
      x_BLD, kv = layer(x_BLD, sin_BLH, cos_BLH, kv, index, key_mask_BS)
      new_kvs.append(kv)
    hidden_BLD = self.final_norm(x_BLD)
    if cache is not None:
      cache = KVCache(k=tuple(kv[0] for kv in new_kvs), v=tuple(kv[1] for kv in new_kvs),
                      mask_BS=key_mask_BS, index=cache.index + L)
    return hidden_BLD, cache

  def logits(self, hidden_BLD):
    if self.config.tie_embeddings:
      head_DV = self.embed.embedding.T
    else:
      head_DV = self.lm_head.variables['params']['kernel']
    return jnp.einsum('BLD,DV->BLV', hidden_BLD, head_DV.astype(hidden_BLD.dtype),
                      preferred_element_type=jnp.float32)

  def init_all(self, tokens_BL, positions_BL, mask_BL):
    hidden_BLD, _ = self(tokens_BL, positions_BL, mask_BL)
    if not self.config.tie_embeddings:
      self.lm_head(hidden_BLD)  # creates lm_head/kernel
    return self.logits(hidden_BLD)


def positions_from_mask(mask_BL):
  """Position of each token among the real ones: cumsum(mask) - 1, clipped at 0 (pads)."""
  return jnp.maximum(jnp.cumsum(mask_BL.astype(jnp.int32), axis=-1) - 1, 0)


def lm_head_DV(params, config: ModelConfig):
  """The output projection [D, V]: embedding^T when tied, else lm_head/kernel."""
  if config.tie_embeddings:
    return params['embed']['embedding'].T
  return params['lm_head']['kernel']


@flax.struct.dataclass
class ForwardOutput:
  """logits_BLV float32 [B, L, V]; hidden_BLD [B, L, D] final-normed (None unless asked);
  cache the updated `KVCache` (None if none was passed)."""
  logits_BLV: jax.Array
  hidden_BLD: jax.Array | None
  cache: KVCache | None


def forward(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
            cache: KVCache | None = None, *, return_hidden: bool = False) -> ForwardOutput:
  _check(config)
  """Run the Transformer on L new tokens.

  Args:
    params: parameter pytree (module docstring).
    config: static `ModelConfig`.
    tokens_BL: [B, L] int token ids.
    positions_BL: [B, L] int RoPE positions (e.g. `positions_from_mask(mask_BL)`).
    mask_BL: [B, L] 1 for real tokens, 0 for pads (pads are never attended to).
    cache: optional `KVCache`; the new tokens are written at slots
      ``cache.index .. cache.index + L - 1`` and attend causally to every real slot up to
      their own. Without a cache attention is causal over the L tokens themselves.
    return_hidden: also return the final-normed hidden states.

  Returns:
    `ForwardOutput(logits_BLV float32, hidden_BLD or None, cache or None)`.
  """
  chex.assert_rank([tokens_BL, positions_BL, mask_BL], 2)
  chex.assert_equal_shape([tokens_BL, positions_BL, mask_BL])
  module = Transformer(config)
  hidden_BLD, cache = module.apply({'params': params}, tokens_BL, positions_BL, mask_BL, cache)
  logits_BLV = module.apply({'params': params}, hidden_BLD, method=Transformer.logits)
  return ForwardOutput(logits_BLV=logits_BLV, hidden_BLD=hidden_BLD if return_hidden else None,
                       cache=cache)


def hidden_states(params, config: ModelConfig, tokens_BL, positions_BL, mask_BL,
                  cache: KVCache | None = None):
  """The trunk only: (final-normed hidden [B, L, D], cache). No LM head."""
  return Transformer(config).apply({'params': params}, tokens_BL, positions_BL, mask_BL, cache)


# ----------------------------------------------------------------------------------------
# The sampler.


@flax.struct.dataclass
class SampleOutput:
  """Result of `sample`; R = B * G rows, row b*G + g is sample g of prompt b.

  Attributes:
    tokens: [R, P + T] int32, the prompt (left-padded) then the completion (pad_id after EOS).
    input_mask: [R, P + T] int32, 1 on real tokens (prompt mask | completion_mask).
    completion: [R, T] int32.
    completion_mask: [R, T] int32, 1 up to and including EOS.
    logps: [R, T] float32, log-prob of each chosen token under the sampling distribution
      (0 where completion_mask is 0).
    truncated: [R] bool, True when no EOS was produced within T tokens.
  """
  tokens: jax.Array
  input_mask: jax.Array
  completion: jax.Array
  completion_mask: jax.Array
  logps: jax.Array
  truncated: jax.Array


@flax.struct.dataclass
class _DecodeState:
  step: jax.Array  # [] int32, index of the next token to sample
  logits_RV: jax.Array  # [R, V] float32, next-token logits
  positions_R: jax.Array  # [R] int32, RoPE position of the next token
  completion_RT: jax.Array
  mask_RT: jax.Array
  logps_RT: jax.Array
  done_R: jax.Array  # [R] bool, EOS already produced
  cache: KVCache


# ----------------------------------------------------------------------------------------
# Logit filters: each maps float32 logits [..., V] to logits with removed tokens at -inf.


def apply_top_k(logits_RV, top_k: int):
  """Keep the `top_k` largest logits (ties at the k-th value are kept)."""
  kth_R1 = jax.lax.top_k(logits_RV, top_k)[0][..., -1:]
  return jnp.where(logits_RV < kth_R1, -jnp.inf, logits_RV)


def apply_top_p(logits_RV, top_p: float):
  """Nucleus: keep token v iff the mass of the tokens strictly more likely than v is < p."""
  sorted_RV = jnp.flip(jnp.sort(logits_RV, axis=-1), axis=-1)
  probs_RV = jax.nn.softmax(sorted_RV, axis=-1)
  mass_before_RV = jnp.cumsum(probs_RV, axis=-1) - probs_RV
  kept_RV = mass_before_RV < top_p
  threshold_R1 = jnp.min(jnp.where(kept_RV, sorted_RV, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits_RV < threshold_R1, -jnp.inf, logits_RV)


def apply_min_p(logits_RV, min_p: float):
  """Keep tokens with p_v >= min_p * max_v p_v, i.e. z_v >= max z + log(min_p)."""
  threshold_R1 = jnp.max(logits_RV, axis=-1, keepdims=True) + jnp.log(min_p)
  return jnp.where(logits_RV < threshold_R1, -jnp.inf, logits_RV)


def sampling_logits(logits_RV, *, temperature: float, top_k: int, top_p: float, min_p: float):
  """The (unnormalised) log-probabilities tokens are drawn from; removed tokens are -inf."""
  logits_RV = logits_RV.astype(jnp.float32) / temperature
  if top_k > 0:
    logits_RV = apply_top_k(logits_RV, top_k)
  if top_p < 1.0:
    logits_RV = apply_top_p(logits_RV, top_p)
  if min_p > 0.0:
    logits_RV = apply_min_p(logits_RV, min_p)
  return logits_RV


def _choose(logits_RV, key, *, temperature, top_k, top_p, min_p, greedy):
  """Returns (token_R int32, logp_R float32)."""
  logits_RV = logits_RV.astype(jnp.float32)
  if greedy:
    token_R = jnp.argmax(logits_RV, axis=-1)
    logp_RV = jax.nn.log_softmax(logits_RV, axis=-1)
  else:
    filtered_RV = sampling_logits(logits_RV, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p)
    token_R = jax.random.categorical(key, filtered_RV, axis=-1)
    logp_RV = jax.nn.log_softmax(filtered_RV, axis=-1)
  logp_R = jnp.take_along_axis(logp_RV, token_R[:, None], axis=-1)[:, 0]
  return token_R.astype(jnp.int32), logp_R


# ----------------------------------------------------------------------------------------
# The jitted sampler.

_STATIC = ('config', 'num_samples', 'max_new_tokens', 'eos_id', 'pad_id', 'temperature', 'top_k',
           'top_p', 'min_p', 'greedy')


def _sample_impl(params, prompt_tokens_BP, prompt_mask_BP, rng, *, config, num_samples,
                 max_new_tokens, eos_id, pad_id, temperature, top_k, top_p, min_p, greedy):
  B, P = prompt_tokens_BP.shape
  G, T = num_samples, max_new_tokens
  R = B * G
  prompt_mask_BP = prompt_mask_BP.astype(jnp.int32)
  choose = functools.partial(_choose, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, greedy=greedy)

  # Prefill once per prompt, then share the cache across the group.
  cache = init_cache(config, B, P + T)
  hidden_BPD, cache = hidden_states(params, config, prompt_tokens_BP,
                                    positions_from_mask(prompt_mask_BP), prompt_mask_BP, cache)
  # Prompts are left-padded, so the last column predicts the first new token; only its
  # logits are computed (never [B, P, V]).
  head_DV = lm_head_DV(params, config)
  logits_BV = jnp.einsum('BD,DV->BV', hidden_BPD[:, -1], head_DV.astype(hidden_BPD.dtype),
                         preferred_element_type=jnp.float32)
  repeat = lambda x: jnp.repeat(x, G, axis=0)
  state = _DecodeState(step=jnp.zeros((), jnp.int32), logits_RV=repeat(logits_BV),
                       positions_R=repeat(jnp.sum(prompt_mask_BP, axis=-1)), completion_RT=jnp.full(
                           (R, T), pad_id, jnp.int32), mask_RT=jnp.zeros((R, T), jnp.int32),
                       logps_RT=jnp.zeros((R, T), jnp.float32), done_R=jnp.zeros(
                           (R,), bool), cache=repeat_cache(cache, G))

  def sample_token(state):
    """Draw token `step` from `logits_RV` and write it (pad after EOS)."""
    token_R, logp_R = choose(state.logits_RV, jax.random.fold_in(rng, state.step))
    live_R = ~state.done_R
    token_R = jnp.where(live_R, token_R, pad_id)
    logp_R = jnp.where(live_R, logp_R, 0.0)
    write = lambda buf_RT, col_R: jax.lax.dynamic_update_slice(buf_RT, col_R[:, None].astype(
        buf_RT.dtype), (0, state.step))
    return state.replace(step=state.step + 1, completion_RT=write(state.completion_RT, token_R),
                         mask_RT=write(state.mask_RT, live_R.astype(jnp.int32)),
                         logps_RT=write(state.logps_RT, logp_R),
                         done_R=state.done_R | (live_R & (token_R == eos_id)))

  def decode_step(state):
    """Feed token `step - 1` through the cache, then sample token `step`."""
    prev = lambda buf_RT: jax.lax.dynamic_slice_in_dim(buf_RT, state.step - 1, 1, axis=1)
    mask_R1 = prev(state.mask_RT)
    out = forward(params, config, prev(state.completion_RT), state.positions_R[:, None], mask_R1,
                  state.cache)
    state = state.replace(logits_RV=out.logits_BLV[:, -1],
                          positions_R=state.positions_R + mask_R1[:, 0], cache=out.cache)
    return sample_token(state)

  def not_finished(state):
    return (state.step < T) & ~jnp.all(state.done_R)

  state = jax.lax.while_loop(not_finished, decode_step, sample_token(state))
  prompt_RP = repeat(prompt_tokens_BP).astype(jnp.int32)
  return SampleOutput(tokens=jnp.concatenate([prompt_RP, state.completion_RT], axis=1),
                      input_mask=jnp.concatenate([repeat(prompt_mask_BP), state.mask_RT],
                                                 axis=1), completion=state.completion_RT,
                      completion_mask=state.mask_RT, logps=state.logps_RT, truncated=~state.done_R)


_sample_jit = jax.jit(_sample_impl, static_argnames=_STATIC)


def sample(params, config: ModelConfig, prompt_tokens_BP, prompt_mask_BP, *, rng: jax.Array,
           num_samples: int, max_new_tokens: int, eos_id: int, pad_id: int,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
           greedy: bool = False) -> SampleOutput:
  """Sample `num_samples` completions for each of B left-padded prompts.

  Args:
    params, config: the policy (`jtc.models.model`).
    prompt_tokens_BP: [B, P] int, prompts LEFT-padded to width P (each needs >= 1 real token).
    prompt_mask_BP: [B, P] 1 on real prompt tokens, 0 on the left padding.
    rng: PRNG key; the output is a deterministic function of it.
    num_samples: G completions per prompt (rows b*G .. b*G + G - 1).
    max_new_tokens: T.
    eos_id, pad_id: end-of-sequence id (kept, mask 1) and the id written after it (mask 0).
    temperature, top_k (0 = off), top_p (1 = off), min_p (0 = off), greedy: see module doc.

  Returns:
    `SampleOutput` with R = B * num_samples rows.
  """
  chex.assert_rank([prompt_tokens_BP, prompt_mask_BP], 2)
  chex.assert_equal_shape([prompt_tokens_BP, prompt_mask_BP])
  V = config.vocab_size
  P = prompt_tokens_BP.shape[1]
  checks = {
      'num_samples': (num_samples, isinstance(num_samples, int) and num_samples >= 1, '>= 1'),
      'max_new_tokens': (max_new_tokens, isinstance(max_new_tokens, int) and max_new_tokens >= 1 and
                         P + max_new_tokens <= config.max_seq_len,
                         f'>= 1 with P + max_new_tokens <= max_seq_len={config.max_seq_len}'),
      'eos_id': (eos_id, 0 <= eos_id < V, f'in [0, {V})'),
      'pad_id': (pad_id, 0 <= pad_id < V, f'in [0, {V})'),
      'temperature': (temperature, greedy or temperature > 0, '> 0'),
      'top_k': (top_k, isinstance(top_k, int) and 0 <= top_k <= V, f'an int in [0, {V}]'),
      'top_p': (top_p, 0 < top_p <= 1, 'in (0, 1]'),
      'min_p': (min_p, 0 <= min_p <= 1, 'in [0, 1]'),
  }
  for name, (value, ok, valid) in checks.items():
    if not ok:
      raise ValueError(f'sample: {name}={value!r} is invalid; must be {valid}')
  return _sample_jit(params, prompt_tokens_BP, prompt_mask_BP, rng, config=config,
                     num_samples=num_samples, max_new_tokens=max_new_tokens, eos_id=int(eos_id),
                     pad_id=int(pad_id), temperature=float(temperature), top_k=int(top_k),
                     top_p=float(top_p), min_p=float(min_p), greedy=bool(greedy))
