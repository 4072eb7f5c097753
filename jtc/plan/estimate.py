"""An analytic memory and step-time estimate of one RL step from the config alone (no compile):
`--suggest`'s pre-filter, which compiles only the settings that can fit, cheapest first.

Memory per chip of each stage = the resident state (parameters, AdamW's two moments, the KL
reference, a policy lag's copies: exact, from the parameter shapes and the logical-axis rules
of `jtc.rl.sharding`; under LoRA the trained parameters are the adapters, the frozen base is one
copy whatever the population and the reference is the base) + what the stage adds:
  sample     the KV cache: Y layers x (R/r rows x T' completion slots + B/b prompts x P slots)
             x K/t kv heads x H x 2 (keys, values) in the compute dtype, plus the [R/r, V]
             float32 logits and the sampling filters' copies of them (4);
  behaviour  one layer's forward on rows/r sequences of L = P + T tokens (`_layer_bytes`), the
             residual stream, and the vocabulary chunk's [T, C/t] float32 logits (3 live copies);
  update     the saved activations (remat: one [L, D] residual per layer and row; without:
             every layer's forward), one layer's backward (2 forwards), the vocabulary chunk
             forward and backward (4 copies), float32 gradients, their accumulator over
             micro-batches and AdamW's updates, the mini-batch's arrays;
with r the rows' shards over (data, fsdp) and t the tensor shards where they divide (as
`sharding.logical_to_spec` places them). Each stage also all-gathers one layer's weights.

Times are roofline estimates at the chip's published peaks (`hardware.CHIPS`): per stage the
slowest of FLOPs (2 N per token forward, + 2 Y N_heads H L per token of causal attention;
backward 2x, remat + 1x), HBM traffic (a decode step reads the weights and the live half of its
cache) and the interconnect: fsdp's all-gathers of the weights (every pass over the layers,
every decode step) and tensor parallelism's two all-reduces of [tokens, D] per layer.

These are estimates to rank and filter candidates, not a verdict: the planner compiles the
winner (`planner.plan`), whose `memory_analysis()` decides. docs/scaling.md compares the two.
"""

import dataclasses
import functools
import math
import types

import jax
import numpy as np

from jtc.models import lora as lora_lib
from jtc.models import model as model_lib
from jtc.plan import stages
from jtc.rl import population as population_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import update as update_lib

VOCAB_CHUNK = 8192  # `logprobs.token_logprobs`'s default chunk


@dataclasses.dataclass
class Estimate:
  """Per chip: bytes of each stage ({stage: bytes}), estimated seconds of one RL step."""
  stage_bytes: dict
  seconds: float

  @property
  def peak(self):
    return max(self.stage_bytes.values())


@functools.lru_cache(maxsize=8)
def _param_shapes(model_config):
  """[(shape, logical axes)] of one member's parameters."""
  shapes = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  axes = model_lib.param_logical_axes(shapes)
  return [(tuple(x.shape), a) for x, a in zip(
      jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)))]


@functools.lru_cache(maxsize=8)
def _adapter_shapes(model_config, rank, targets):
  """[(shape, logical axes)] of one member's LoRA adapters (`lora.init_adapters`)."""
  shapes = jax.eval_shape(lambda: lora_lib.init_adapters(model_config, rank=rank, targets=lora_lib.
                                                         parse_targets(targets)))
  axes = lora_lib.logical_axes(shapes)
  return [(tuple(x.shape), a) for x, a in zip(
      jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)))]


def shard_elements(shape, logical_axes, sizes):
  """Elements per chip of an array with these logical axes on a mesh of ``sizes``."""
  spec = sharding_lib.logical_to_spec(logical_axes, shape, types.SimpleNamespace(shape=sizes))
  n = 1
  for dim, axes in zip(shape, spec):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    n *= dim // math.prod(sizes[a] for a in axes)
  return n


def _rows(rows, sizes):
  """Rows per chip of a [rows, ...] batch."""
  return shard_elements((rows,), ('batch',), sizes)


def _layer_bytes(m, rows, L, t):
  """One layer's forward working set on ``rows`` sequences of L tokens (compute dtype d): the
  input and normed residual (d, f32), q and the float32 attention output of N/t heads, k and v
  of K/t heads, gate, up and their product over F/t."""
  d = np.dtype(m.jnp_dtype).itemsize
  heads, kv = m.n_heads // _div(m.n_heads, t), m.n_kv_heads // _div(m.n_kv_heads, t)
  per_token = (m.d_model * (2 * d + 4) + heads * m.head_dim * (d + 4) + 2 * kv * m.head_dim * d +
               3 * (m.d_ff // _div(m.d_ff, t)) * d)
  return rows * L * per_token


def _div(n, t):
  return t if n % t == 0 else 1


def state_bytes(c, model_config, sizes):
  """{'base', 'params', 'opt_state', 'reference', 'lagged'} bytes per chip of config ``c``'s
  state: under LoRA (lora.rank > 0) 'params' are the adapters and 'base' the frozen policy, one
  copy for every member, which is also the reference; without, 'base' is 0."""
  pop = population_lib.Population.of(c)
  members = pop.n // sizes['population'] if pop.batched else 1
  p = np.dtype(model_config.jnp_param_dtype).itemsize
  policy = sum(shard_elements(s, a, sizes) for s, a in _param_shapes(model_config))
  trained = policy
  if c.lora.rank:
    trained = sum(
        shard_elements(s, a, sizes)
        for s, a in _adapter_shapes(model_config, c.lora.rank, c.lora.targets))
  elems = members * trained
  kl = stages.keeps_reference(c, pop) and not c.lora.rank
  ref = np.dtype(c.policy.ref_param_dtype or model_config.param_dtype).itemsize
  return {
      'base': policy * p if c.lora.rank else 0,
      'params': elems * p,
      'opt_state': 2 * elems * p,  # AdamW: mu and nu, like the params
      'reference': elems * ref if kl else 0,
      'lagged': c.rollout.policy_lag * elems * p
  }


@dataclasses.dataclass
class Context:
  """What every stage's estimate needs: the model, mesh sizes, chip and derived constants."""
  m: object
  sizes: dict
  chip: object
  resident: float  # the state per chip
  n_params: int

  @property
  def t(self):
    return self.sizes['tensor']

  @property
  def chips(self):  # the chips one member's work spreads over
    return math.prod(self.sizes.values()) // self.sizes['population']

  @property
  def d(self):
    return np.dtype(self.m.jnp_dtype).itemsize

  @property
  def p(self):
    return np.dtype(self.m.jnp_param_dtype).itemsize

  @property
  def vocab_chunk(self):
    """Columns per chip of `logprobs.token_logprobs`'s vocabulary chunk (the head's vocabulary
    is sharded over 'tensor')."""
    C = min(VOCAB_CHUNK, self.m.vocab_size)
    return C // _div(C, self.t)

  @property
  def layer(self):
    """One layer's weights gathered over fsdp (and the next one's in flight)."""
    return self.n_params / self.m.n_layers / self.t * self.p * 2

  @property
  def gather(self):
    """The bytes of weights a chip receives in one pass over the layers (fsdp > 1)."""
    return self.n_params * self.p / self.t if self.sizes['fsdp'] > 1 else 0

  def activations(self, tokens):
    """The bytes a chip all-reduces over 'tensor' in a pass over ``tokens`` tokens: two
    [tokens, D] sums per layer (attention and MLP outputs), a chip holding chips / t of them."""
    if self.t == 1:
      return 0
    return 2 * 2 * tokens / (self.chips / self.t) * self.m.d_model * self.d * self.m.n_layers

  def roof(self, flops, hbm, link):
    return max(flops / self.chips / self.chip.peak_flops, hbm / self.chip.hbm_bandwidth,
               link / self.chip.link_bandwidth)

  def flops(self, tokens, L):
    """Forward FLOPs of ``tokens`` tokens in rows of L: 2 N per token + causal attention."""
    m = self.m
    return tokens * (2 * self.n_params + 2 * m.n_layers * m.n_heads * m.head_dim * L)


def kv_cache_bytes(x, B, G, P, T):
  """The sampler's `decode.GroupCache` per chip: B prompts' P slots and B x G rows' T slots
  (rounded up to blocks of 128 on an accelerator) of keys and values, every layer."""
  m = x.m
  r, b = _rows(B * G, x.sizes), _rows(B, x.sizes)
  kv = m.n_kv_heads // _div(m.n_kv_heads, x.t)
  T_pad = T if x.chip.platform == 'cpu' else -(-T // min(128, T)) * min(128, T)
  return m.n_layers * kv * m.head_dim * 2 * x.d * (r * T_pad + b * P)


def context(c, model_config, sizes, chip):
  """The `Context` of config ``c`` on a mesh of ``sizes`` of ``chip``s."""
  return Context(model_config, sizes, chip, sum(state_bytes(c, model_config, sizes).values()),
                 _n_params(model_config))


def _n_params(model_config):
  return sum(math.prod(s) for s, _ in _param_shapes(model_config))


def _sampler(x, B, G, P, T):
  """(bytes per chip without the state, seconds) of one sampler call of B prompts x G."""
  m = x.m
  r, b = _rows(B * G, x.sizes), _rows(B, x.sizes)
  cache = kv_cache_bytes(x, B, G, P, T)
  nbytes = cache + r * m.vocab_size * 4 * 4 + _layer_bytes(m, b, P, x.t)
  per_token = x.roof(2 * x.n_params * B * G, x.n_params * x.p / x.t + cache / 2,
                     x.gather + x.activations(B * G))
  return nbytes, T * per_token + x.roof(x.flops(B * P, P), 0, x.gather + x.activations(B * P))


def _scoring(x, c, rows):
  """(bytes, seconds) of one behaviour (or reference) pass over all the step's rows."""
  m = x.m
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  r, C = _rows(rows, x.sizes), x.vocab_chunk
  nbytes = _layer_bytes(m, r, P + T, x.t) + r * (P + T) * m.d_model * x.d * 2 + 3 * r * T * C * 4
  all_rows = c.rollout.prompts_per_step * c.rollout.sampling.num_samples
  return nbytes, x.roof(x.flops(all_rows * (P + T), P + T), 0,
                        x.gather * all_rows / rows + x.activations(all_rows * (P + T)))


def _update(x, c, grads):
  """(bytes, seconds) of the update: every mini-batch's micro-batches."""
  m = x.m
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  L, C = P + T, x.vocab_chunk
  mb = update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples
  n_micro = update_lib.num_microbatches(c.optim)
  r = _rows(mb, x.sizes)
  saved = m.n_layers * (r * L * m.d_model * x.d if m.remat else _layer_bytes(m, r, L, x.t))
  batch = n_micro * r * (2 * L * 4 + 5 * T * 4)
  nbytes = saved + 2 * _layer_bytes(m, r, L, x.t) + 4 * r * T * C * 4 + batch
  passes = 4 if m.remat else 3  # forward, backward (2), the remat forward
  calls = update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step) * n_micro
  seconds = calls * x.roof(
      x.flops(mb * L, L) * passes, 0,
      x.gather * (passes - 1) + x.activations(mb * L) * passes)
  # Gradients, their float32 accumulator over micro-batches, AdamW's updates.
  return nbytes + grads * (3 if n_micro > 1 else 2), seconds


def estimate(c, model_config, sizes, chip) -> Estimate:
  """The `Estimate` of config ``c`` (with ``model_config``) on a mesh of ``sizes`` of ``chip``s:
  per stage the members' own bytes + the state; the step's seconds, every member's work."""
  pop = population_lib.Population.of(c)
  members = pop.n // sizes['population'] if pop.batched else 1
  state = state_bytes(c, model_config, sizes)
  x = Context(model_config, sizes, chip, sum(state.values()), _n_params(model_config))
  G, P = c.rollout.sampling.num_samples, c.data.prompt_width
  B = c.rollout.chunk_prompts or c.rollout.prompts_per_step
  out, seconds = {}, 0.0
  nbytes, s = _sampler(x, B, G, P, c.rollout.sampling.max_new_tokens)
  out['sample'] = members * nbytes
  seconds += s * c.rollout.prompts_per_step / B
  rows = (rollout_lib.score_chunk_prompts(c.rollout) or c.rollout.prompts_per_step) * G
  nbytes, s = _scoring(x, c, rows)
  out['behaviour'] = members * nbytes
  seconds += s * ((2 if c.rollout.policy_lag else 1) + stages.keeps_reference(c, pop))
  grads = state['params'] / x.p * 4  # float32 gradients
  nbytes, s = _update(x, c, grads / members)
  out['update'] = members * nbytes
  seconds += s
  if c.eval.every:
    B = c.eval.batch_prompts
    nbytes, s = _sampler(x, B, c.eval.sampling.num_samples, P, c.eval.sampling.max_new_tokens)
    out['eval'] = members * nbytes
    seconds += s * -(-c.eval.problems // B) / c.eval.every
  return Estimate({k: v + x.resident + x.layer for k, v in out.items()}, seconds * members)
