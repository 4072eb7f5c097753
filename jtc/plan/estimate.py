"""An analytic memory and step-time estimate of one RL step without a compile: `--suggest`'s
pre-filter, which compiles only the settings that can fit, cheapest first.

It reads the trainer's own step (`jtc.rl.step.build` on a `jax.sharding.AbstractMesh` of the
candidate's sizes: no devices): each stage's arguments and the state it holds meanwhile are the
`jtc.rl.stages.Stage`'s, exact to the byte (the parameters, AdamW's moments, a LoRA run's base,
the KL reference, a policy lag's copies, a population's members, the batches); only what the
compiler adds inside each program is modelled, per member on a chip:
  sample     the KV cache: Y layers x (R/r rows x T' completion slots + B/b prompts x P slots)
             x K/t kv heads x H x 2 (keys, values) in the compute dtype, plus the [R/r, V]
             float32 logits and the sampling filters' copies of them (4);
  behaviour  one layer's forward on rows/r sequences of L = P + T tokens (`_layer_bytes`), the
             residual stream, the vocabulary chunk's [T, C/t] float32 logits (3 live copies)
             and its outputs (log-probs, entropies and, for DelTA, the hidden states);
  delta      DelTA's per-token [B/r, T] float32 vectors (margins, scores, weights, ...: 12),
             a chunk of the token-gradient proxies and a copy of the hidden states (held), or
             one scoring chunk's forward and hidden states, its 2K + 2 forwards timed
             (delta.hidden = 'recomputed');
  update     the saved activations (remat: one [L, D] residual per layer and row; without:
             every layer's forward), one layer's backward (2 forwards), the vocabulary chunk
             forward and backward (4 copies), float32 gradients, their accumulator over
             micro-batches and AdamW's updates;
with r the rows' shards over (data, fsdp) and t the tensor shards where they divide (as
`sharding.logical_to_spec` places them). Each stage also all-gathers one layer's weights.

Times are roofline estimates at the chip's published peaks (`hardware.CHIPS`): per stage the
slowest of FLOPs (2 N per token forward, + 2 Y N_heads H L per token of causal attention;
backward 2x, remat + 1x), HBM traffic (a decode step reads the weights and the live half of its
cache) and the interconnect: fsdp's all-gathers of the weights (every pass over the layers,
every decode step) and tensor parallelism's two all-reduces of [tokens, D] per layer.

These are estimates to rank and filter candidates, not a verdict: the planner compiles the
winner (`planner.plan`), whose `memory_analysis()` decides. docs/scaling.md compares the two.

Dimension key (docs/dimensions.md): B prompts, G group size, R = B G rows, P prompt width, T new
tokens, L = P + T, D model width, V vocabulary, C vocabulary chunk, Y layers.
"""

import dataclasses
import functools
import math
import types

import jax
import numpy as np

from jtc.models import gated_deltanet
from jtc.models import layer_types
from jtc.models import model as model_lib
from jtc.objectives import delta_recompute
from jtc.rl import sharding as sharding_lib
from jtc.rl import stages as stages_lib
from jtc.rl import step as step_lib

VOCAB_CHUNK = 8192  # `logprobs.token_logprobs`'s default chunk
# Calibrated on the 14 compiled update stages of the generated table (docs/scaling.md; the
# mean error of the update's estimate fell from 21 % to 10 % of the compiled peak): without
# remat XLA keeps about this many times one layer's forward working set (`_layer_bytes`) per
# layer for the backward pass (3.9 to 4.7 times the estimate's per-layer bytes on
# Llama-3.2-1B and Qwen3-0.6B at tensor 4 and 8); besides the gradients' accumulator the
# update holds this many float32 gradient-sized buffers (the gradients, the clipped gradients,
# AdamW's updates: the data-parallel Llama-3.2-1B on v5p-64 holds one more than two).
SAVED_WITHOUT_REMAT = 3.5
GRAD_COPIES = 3
STAGES = ('sample', 'behaviour', 'reference', 'delta', 'update', 'eval')


@dataclasses.dataclass
class Estimate:
  """Per chip: bytes of each stage ({stage: bytes}), estimated seconds of one RL step."""
  stage_bytes: dict
  seconds: float

  @property
  def peak(self):
    return max(self.stage_bytes.values())


@functools.lru_cache(maxsize=8)
def param_shapes(model_config):
  """One member's parameters as ShapeDtypeStructs (`model.init_params`, traced once)."""
  return jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))


def abstract_step(c, model_config, sizes):
  """The trainer's `jtc.rl.step.Step` of config ``c`` on a mesh of ``sizes`` without devices."""
  mesh = jax.sharding.AbstractMesh(tuple(sizes.get(a, 1) for a in sharding_lib.MESH_AXES),
                                   sharding_lib.MESH_AXES)
  return step_lib.build(c, mesh, model_config, params=param_shapes(model_config))


def shard_elements(shape, logical_axes, sizes):
  """Elements per chip of an array with these logical axes on a mesh of ``sizes`` (an axis it
  does not name has size 1)."""
  sizes = {a: sizes.get(a, 1) for a in sharding_lib.MESH_AXES}
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
  of K/t heads, and the feed-forward's (`_ffn_bytes_per_token`)."""
  d = np.dtype(m.jnp_dtype).itemsize
  heads, kv = m.n_heads // _div(m.n_heads, t), m.n_kv_heads // _div(m.n_kv_heads, t)
  per_token = (m.d_model * (2 * d + 4) + heads * m.head_dim * (d + 4) + 2 * kv * m.head_dim * d +
               _ffn_bytes_per_token(m, t))
  return rows * L * per_token


def _ffn_bytes_per_token(m, t):
  """A token's feed-forward working set: a dense MLP's gate, up and their product over F/t; a
  mixture of experts' (`jtc.models.moe`, each chip sorting its own rows' pairs) float32 router
  logits and probabilities over X experts, and for each of its W (token, expert) pairs the
  token's D-vector sorted by expert, the expert's gate, up and product over F/t, its output
  sorted and back in token order; plus a shared expert's gate, up and product over Fs/t."""
  d = np.dtype(m.jnp_dtype).itemsize
  width = lambda F: 3 * (F // _div(F, t)) * d
  if not m.n_experts:
    return width(m.d_ff)
  W = m.experts_per_token
  return (2 * m.n_experts * 4 + W * (3 * m.d_model * d + width(m.d_expert)) +
          (width(m.d_shared_expert) if m.d_shared_expert else 0))


def _div(n, t):
  return t if n % t == 0 else 1


@dataclasses.dataclass
class Context:
  """What every stage's estimate needs: the model, mesh sizes, chip, prompt width, DelTA's
  options and derived constants."""
  m: object
  sizes: dict
  chip: object
  n_params: int
  P: int = 0
  delta_options: object = None

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

  @property
  def active_params(self):
    """The parameters a token's forward multiplies by (`active_params`)."""
    return active_params(self.m, self.n_params)

  def flops(self, tokens, L):
    """Forward FLOPs of ``tokens`` tokens in rows of L: 2 N per token (N the active parameters:
    a mixture of experts' W of X) + causal attention in the full-attention layers; a hybrid's
    linear-attention layers add, per token, the delta rule's state products and the chunked
    form's within-chunk products (`delta_rule`)."""
    m = self.m
    stacks = layer_types.stack_sizes(m)
    attention = 2 * stacks.get('attn', 0) * m.n_heads * m.head_dim * L
    _, H, N, Hv, _ = gated_deltanet.dims(m)
    linear = 2 * stacks.get('linear_attn', 0) * N * (2 * H * Hv + m.linear_chunk * (H + Hv))
    return tokens * (2 * self.active_params + attention + linear)


def active_params(m, n_params):
  """Of ``n_params``, those a token's forward uses: a mixture of experts' layers (every layer
  when n_experts > 0, `jtc.models.moe`) leave X - W experts' gate, up and down idle."""
  idle = m.n_layers * (m.n_experts - m.experts_per_token) * 3 * m.d_model * m.d_expert
  return n_params - (idle if m.n_experts else 0)


def kv_cache_bytes(x, B, G, P, T, slots=None):
  """The sampler's `decode.GroupCache` per chip: B prompts' P slots and R rows' T slots
  (rounded up to blocks of 128 on an accelerator) of keys and values, every full-attention
  layer; in a hybrid, also each row's state in every linear-attention layer (`linear`). R is
  B x G, or the continuous scheduler's ``slots``, whose hybrid cache also keeps each of the B
  prompts' final linear states to restart rows from (`prompt_linear`)."""
  m = x.m
  R = slots or B * G
  r, b = _rows(R, x.sizes), _rows(B, x.sizes)
  kv = m.n_kv_heads // _div(m.n_kv_heads, x.t)
  T_pad = T if x.chip.platform == 'cpu' else -(-T // min(128, T)) * min(128, T)
  stacks = layer_types.stack_sizes(m)
  kv_bytes = stacks.get('attn', 0) * kv * m.head_dim * 2 * x.d * (r * T_pad + b * P)
  Y = stacks.get('linear_attn', 0)
  return kv_bytes + linear_state_bytes(x, Y, R) + (linear_state_bytes(x, Y, B) if slots else 0)


def linear_state_bytes(x, Y, rows):
  """Per chip, the `gated_deltanet.LinearState` of ``rows`` rows in Y linear-attention layers
  (constant in the sequence length): the convolutions' last W - 1 inputs (compute dtype) and
  the float32 delta-rule state, sharded as `gated_deltanet.STATE_AXES`."""
  if not Y:
    return 0
  K, H, N, Hv, W = gated_deltanet.dims(x.m)
  axes = gated_deltanet.STATE_AXES
  shapes = gated_deltanet.LinearState(conv_q=(Y, rows, W - 1, K, H), conv_k=(Y, rows, W - 1, K, H),
                                      conv_v=(Y, rows, W - 1, N, Hv), ssm_BNHH=(Y, rows, N, H, Hv))
  itemsize = dict(conv_q=x.d, conv_k=x.d, conv_v=x.d, ssm_BNHH=4)
  return sum(
      shard_elements(getattr(shapes, f), getattr(axes, f), x.sizes) * n
      for f, n in itemsize.items())


def context(c, model_config, sizes, chip, weighter=None):
  """The `Context` of config ``c`` on a mesh of ``sizes`` of ``chip``s (``weighter``: the
  step's token-weight plug-in, DelTA's options)."""
  return Context(model_config, sizes, chip, model_lib.num_params(param_shapes(model_config)),
                 P=c.data.prompt_width,
                 delta_options=weighter.options if weighter is not None else None)


def _sampler(x, stage):
  """(bytes per member, seconds per call) of a sampler stage: B prompts x G rows, T tokens."""
  m = x.m
  B, P = stage.args[1].shape[-2:]
  G, T = stage.kwargs['num_samples'], stage.kwargs['max_new_tokens']
  R = stage.kwargs.get('slots') or B * G  # continuous: its decode slots
  r, b = _rows(R, x.sizes), _rows(B, x.sizes)
  cache = kv_cache_bytes(x, B, G, P, T, stage.kwargs.get('slots'))
  nbytes = cache + r * m.vocab_size * 4 * 4 + _layer_bytes(m, b, P, x.t)
  # Time as the compiled plan counts it: B x G rows' T tokens (the decode loop at T steps).
  per_token = x.roof(2 * x.active_params * B * G, x.n_params * x.p / x.t + cache / 2,
                     x.gather + x.activations(B * G))
  return nbytes, T * per_token + x.roof(x.flops(B * P, P), 0, x.gather + x.activations(B * P))


def _scoring(x, stage, hidden):
  """(bytes per member, seconds per call) of one behaviour (or reference) pass of rows x L
  tokens; ``hidden``: it also returns the hidden states (DelTA)."""
  m = x.m
  rows, L = stage.args[1].shape[-2:]
  r, C, T = _rows(rows, x.sizes), x.vocab_chunk, L - x.P
  outputs = r * T * (2 * 4 + (m.d_model * x.d if hidden else 0))
  nbytes = (_layer_bytes(m, r, L, x.t) + r * L * m.d_model * x.d * 2 + 3 * r * T * C * 4 + outputs)
  return nbytes, x.roof(x.flops(rows * L, L), 0, x.gather + x.activations(rows * L))


def _delta(x, stage, weighter):
  """(bytes per member, seconds) of DelTA's coefficient pass over the step's B x T tokens: its
  per-token float32 vectors and one chunk of [rows, C, D] proxies (three live copies), and
  either the held hidden states' copy or (``weighter.hidden == 'recomputed'``) one chunk of
  rows' forward pass and hidden states, that forward run in each of the 2K + 2 passes."""
  B, T = stage.args[2]['logps'].shape[-2:]
  D, r, options = x.m.d_model, _rows(B, x.sizes), x.delta_options
  passes = 2 * options.num_refine + 2
  if weighter.needs_hidden:
    chunk_T = max(1, min(T, -(-options.chunk_size // B)))
    hidden = r * T * D * x.d
    # A copy of the hidden states (the compiled pass takes one for its loops: 8.05 GiB of
    # temporaries beside 8.0 GiB of hidden states, Qwen3-8B on v5p-64).
    nbytes = hidden + 12 * r * T * 4 + 3 * r * chunk_T * D * 4
    return nbytes, x.roof(passes * 8 * B * T * D, passes * hidden, 0)
  R = delta_recompute.rows_per_chunk(B, weighter.chunk_rows)
  rc, L = _rows(R, x.sizes), T + x.P
  chunk_T = max(1, min(T, -(-options.chunk_size // R)))
  forward = _layer_bytes(x.m, rc, L, x.t) + rc * L * D * x.d * 2
  nbytes = 2 * rc * T * D * x.d + forward + 12 * r * T * 4 + 3 * rc * chunk_T * D * 4
  seconds = passes * (x.roof(x.flops(B * L, L), 0, x.gather + x.activations(B * L)) +
                      x.roof(8 * B * T * D, 0, 0))
  return nbytes, seconds


def _update(x, stage, grads):
  """(bytes per member, seconds per call) of the update of one mini-batch of n micro-batches
  (``grads``: the float32 gradients' bytes per member)."""
  m = x.m
  n, mb, L = stage.args[1].tokens_BL.shape[-3:]
  C, T = x.vocab_chunk, L - x.P
  r = _rows(mb, x.sizes)
  saved = m.n_layers * (r * L * m.d_model * x.d if m.remat else SAVED_WITHOUT_REMAT *
                        _layer_bytes(m, r, L, x.t))
  nbytes = saved + 2 * _layer_bytes(m, r, L, x.t) + 4 * r * T * C * 4
  passes = 4 if m.remat else 3  # forward, backward (2), the remat forward
  seconds = n * x.roof(
      x.flops(mb * L, L) * passes, 0,
      x.gather * (passes - 1) + x.activations(mb * L) * passes)
  # Gradients, their float32 accumulator over micro-batches, AdamW's updates and the clipped
  # gradients.
  return nbytes + grads * (GRAD_COPIES + (n > 1)), seconds


def stage_estimate(x, stage, step):
  """(bytes per chip, seconds per RL step) of ``stage`` (a `jtc.rl.stages.Stage` of ``step``):
  its arguments and the state it holds meanwhile, exact; what it adds, per member, estimated."""
  members = step.pop.n // x.sizes['population'] if step.pop.batched else 1
  if stage.name in ('sample', 'eval'):
    nbytes, seconds = _sampler(x, stage)
  elif stage.name in ('behaviour', 'reference'):
    nbytes, seconds = _scoring(x, stage, hidden=step.weighter is not None and
                               step.weighter.needs_hidden)
  elif stage.name == 'delta':
    nbytes, seconds = _delta(x, stage, step.weighter)
  elif stage.name == 'update':
    grads = stages_lib.chip_bytes(step.state.params) / x.p * 4 / members  # float32 gradients
    nbytes, seconds = _update(x, stage, grads)
  else:
    raise ValueError(f'no estimate of stage {stage.name!r}; valid: {list(STAGES)}')
  args = stages_lib.chip_bytes(stage.args)
  return (members * nbytes + args + stage.resident_other + x.layer, members * seconds * stage.calls)


def estimate(c, model_config, sizes, chip, *, step=None, memo=None, key=None) -> Estimate:
  """The `Estimate` of config ``c`` (with ``model_config``) on a mesh of ``sizes`` of
  ``chip``s: per stage its bytes per chip; the step's seconds, every member's work.

  ``step``: an `abstract_step` of a config with ``c``'s state on this mesh (a search varies
  only chunks, micro-batches and remat: one step per mesh); ``memo`` with ``key(stage)``: a
  dict of stage estimates shared by the candidates of one search (a stage's estimate depends
  on the keys its program does, `suggest.STAGE_KEYS`)."""
  step = step or abstract_step(c, model_config, sizes)
  # The candidate's token weights (DelTA's hidden states held or recomputed, its row chunk).
  step = dataclasses.replace(
      step, c=c, model_config=model_config,
      weighter=step_lib.token_weighter(c, model_config, step.infer_config, step.mesh))
  x = context(c, model_config, sizes, chip, step.weighter)
  keys = {name: None if memo is None else key(name) for name in STAGES}
  todo = [name for name, k in keys.items() if k is None or k not in memo]
  fresh = {
      stage.name: stage_estimate(x, stage, step)
      for stage in stages_lib.build(step, chip.platform, only=todo)
      if stage.in_total
  }
  for name, k in keys.items():
    if k is not None and name in fresh:
      memo[k] = fresh[name]
  results = {
      name: fresh[name] if name in fresh else memo[keys[name]]
      for name in STAGES
      if name in fresh or (keys[name] is not None and keys[name] in memo)
  }
  return Estimate({k: v[0] for k, v in results.items()}, sum(v[1] for v in results.values()))
