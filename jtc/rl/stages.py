"""The programs of one RL step with their abstract arguments: what the planner compiles and the
trainer's preflight checks (`jtc.rl.step.Step.stages`).

Each `Stage` is a jitted function of the step (the very object the trainer calls, so a compile
here fills the cache its steps hit), its arguments as ShapeDtypeStructs carrying the shapes and
shardings the trainer passes, how often it runs in one RL step and which parts of the resident
state are among its arguments:
  prefill     `jtc.models.decode.prefill` of one sampler call (the prompts' forward pass; its
              own program, inside the sample stage's);
  sample      `jtc.models.sampler` for rollout.chunk_prompts x G rows and T new tokens, with its
              KV cache (the program `rollout.Generator` runs);
  behaviour   `Step.behaviour` (+ hidden states for DelTA, held) of `rollout.score_chunk_prompts`
              groups (twice under a policy lag: the behaviour and the proximal policy);
  reference   the same function on the KL reference (kl_coef > 0);
  delta       `Step.delta`: DelTA's coefficients from the behaviour pass's hidden states, or
              recomputing them a scoring chunk at a time (config.delta.hidden);
  update      `Step.update` of one mini-batch (micro-batches, remat, AdamW state);
  eval        the sampler at the evaluation decoding (eval.batch_prompts prompts a call, as
              `jtc.rl.evaluation.evaluate` batches them), amortised over eval.every steps.
A population adds the member axis to every argument; a LoRA run's passes read
`lora.Adapted(base, adapters)` and its update takes the base as a fourth argument.

Dimension key (docs/dimensions.md): B rows, P prompt width, T new tokens, L = P + T, D model width.
"""

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp

from jtc.models import decode
from jtc.models import decode_loop
from jtc.models import sampler as sampler_lib
from jtc.rl import decoding as decoding_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import update as update_lib


@dataclasses.dataclass
class Stage:
  """One jitted function of the RL step and how to compile it."""
  name: str
  fn: Any
  args: tuple
  kwargs: dict
  calls: float  # runs per RL step
  resident_other: float = 0.0  # bytes per chip held in HBM meanwhile, not among its arguments
  unknown_trips: tuple = ()  # trip counts of its non-constant loops (`jtc.plan.hlo`)
  flops_note: str = 'hlo'
  in_total: bool = True  # False: inside another stage's program (the prefill)
  decoding: Any = None  # a sampler stage's `jtc.rl.decoding.Decoding`

  def compile(self):
    """(lowered, compiled, seconds); the compiler's errors pass through."""
    t0 = time.perf_counter()
    lowered = self.fn.trace(*self.args, **self.kwargs).lower()
    compiled = lowered.compile()
    return lowered, compiled, time.perf_counter() - t0


def chip_bytes(tree) -> float:
  """Bytes per device of a pytree of sharded arrays or ShapeDtypeStructs (the largest shard)."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    sharding = getattr(x, 'sharding', None)
    shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
    total += float(math.prod(shape)) * x.dtype.itemsize
  return total


def batch_arg(step, shape, dtype):
  """An abstract [(E,) shape] batch array with the rollouts' sharding (rows over the batch
  axes), as the trainer's ``to_device`` places it."""
  pop = step.pop
  shape = (pop.n,) * pop.batched + tuple(shape)
  return jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding_lib.batch_sharding(step.mesh, shape, members=pop.batched))


def replay_dims(step):
  """(Y, W) of the experts a MoE policy's training passes replay (`rollout.routing_replay`, one
  int16 per token, layer and routed expert), or None (no replay)."""
  mc = step.model_config
  if not mc.is_moe or step.c.rollout.routing_replay == 'none':
    return None
  return mc.n_layers, mc.experts_per_token


def keys_arg(pop):
  """The members' keys: uncommitted, as the trainer passes them (split on the host's default
  device), so that a compile here is the one the trainer's call finds."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct((pop.n,) if pop.batched else (), key.dtype)


def sampler_stage(step, name, sampling, model_config, *, platform, calls, B, free_bytes=None):
  """The sampler program for one call of B prompts, its cache's rows over the batch axes (as
  the trainer's `rollout.Generator` samples), with the rollout's scheduler, slots and layout
  (`jtc.rl.decoding`: from ``free_bytes``, the devices' free memory, None: measured now)."""
  pop, P, r = step.pop, step.c.data.prompt_width, step.c.rollout
  T = sampling['max_new_tokens']
  free = decode_loop.free_device_bytes() if free_bytes is None else free_bytes
  decoding = decoding_lib.resolve(r, model_config, step.mesh, rows=B * sampling['num_samples'],
                                  max_new_tokens=T, members=pop.n if pop.batched else 1,
                                  block_size=sampler_lib.resolve_block_size(None, T, platform),
                                  free_bytes=free)
  fn, static = sampler_lib.program(
      model_config, P, members=pop.batched, platform=platform, eos_id=step.ids[0],
      pad_id=step.ids[1], row_sharding=sharding_lib.RowSharding(step.mesh), num_prompts=B,
      scheduler=decoding.scheduler, slots=decoding.compiled_slots,
      max_decode_steps=(r.get('max_decode_steps', 0) or None) if name == 'sample' else None,
      decode_layout=sharding_lib.DecodeLayout(step.mesh) if decoding.layout == 'tensor' else None,
      **sampling)
  prompts = batch_arg(step, (B, P), jnp.int32)
  args = (step.policy(step.state.params), prompts, prompts, keys_arg(pop))
  if pop.batched:
    args += (None,)
  C = static['block_size']
  return Stage(name, fn, args, static, calls, resident_other=step.resident('params', 'base'),
               unknown_trips=(T, (T // C) / 2 + 1), flops_note='hlo, loops at T tokens',
               decoding=decoding)


def prefill_stage(step, *, platform, calls):
  """`decode.prefill` of one sampler call: the prompts' forward pass and the cache it fills."""
  c, pop = step.c, step.pop
  B = c.rollout.chunk_prompts or c.rollout.prompts_per_step
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  prefill = functools.partial(decode.prefill, config=step.sampler_config,
                              num_samples=c.rollout.sampling.num_samples, max_new_tokens=T,
                              block_size=sampler_lib.resolve_block_size(None, T, platform),
                              row_sharding=sharding_lib.RowSharding(step.mesh))
  fn = jax.jit(pop.map(lambda p, t, m: prefill(p, prompt_tokens_BP=t, prompt_mask_BP=m), spmd=True))
  prompts = batch_arg(step, (B, P), jnp.int32)
  return Stage('prefill', fn, (step.policy(step.state.params), prompts, prompts), {}, calls,
               resident_other=step.resident('params', 'base'), in_total=False)


def step_batch(step):
  """The abstract `update.Batch` of the whole step's rows, as `batch.make_batch` leaves it on the
  device (held from the scoring passes through the last update)."""
  c = step.c
  B = c.rollout.prompts_per_step * c.rollout.sampling.num_samples
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  f32 = lambda *shape: batch_arg(step, shape, jnp.float32)
  return update_lib.Batch(
      tokens_BL=batch_arg(step, (B, P + T), jnp.int32),
      input_mask_BL=batch_arg(step, (B, P + T), jnp.int32), mask_BT=f32(B, T), advantages_B=f32(B),
      old_logps_BT=f32(B, T), ref_logps_BT=f32(B, T) if step.ref is not None else None,
      token_weights_BT=f32(B, T) if c.token_weights else None,
      is_weights_BT=f32(B, T) if c.rollout.correction != 'none' or
      (c.rollout.policy_lag and c.rollout.policy_lag_mode == 'decoupled') else None,
      replay_BLYW=None if replay_dims(step) is None else batch_arg(step,
                                                                   (B, P + T,
                                                                    *replay_dims(step)), jnp.int16))


def scoring_outputs(step, rows):
  """The abstract outputs of one behaviour pass over ``rows`` rows."""
  T = step.c.rollout.sampling.max_new_tokens
  out = {'logps': batch_arg(step, (rows, T), jnp.float32)}
  out['entropy'] = out['logps']
  if step.model_config.is_moe:  # the router's own experts of the completion tokens
    mc = step.model_config
    out['experts'] = batch_arg(step, (rows, T, mc.n_layers, mc.experts_per_token), jnp.int32)
  if step.weighter is not None and step.weighter.needs_hidden:  # DelTA's, held (delta.hidden)
    out['hidden'] = batch_arg(step, (rows, T, step.model_config.d_model),
                              step.infer_config.jnp_dtype)
  return out


def scoring_stages(step):
  """The behaviour pass, the reference pass (kl_coef > 0) and the token weights (DelTA). Each
  pass holds meanwhile the rollouts on the device, its earlier calls' outputs and the passes
  before it (the behaviour pass's before a proximal or reference pass); over several calls,
  the concatenation of their outputs (`rollout.behaviour_logps`) holds the parts and the whole
  at once, counted here as a whole more than the parts (an upper bound: the call's own
  temporaries are gone by then)."""
  c = step.c
  G, P, T = c.rollout.sampling.num_samples, c.data.prompt_width, c.rollout.sampling.max_new_tokens
  rows = (rollout_lib.score_chunk_prompts(c.rollout) or c.rollout.prompts_per_step) * G
  calls = c.rollout.prompts_per_step * G / rows
  tokens = batch_arg(step, (rows, P + T), jnp.int32)
  policy = step.policy(step.state.params)
  inputs = 2 * chip_bytes(batch_arg(step, (c.rollout.prompts_per_step * G, P + T), jnp.int32))
  # A MoE policy's replayed experts: one chunk's as an argument, the step's held (`make_batch`).
  replay = () if replay_dims(step) is None else (batch_arg(step, (rows, P + T,
                                                                  *replay_dims(step)), jnp.int16),)
  inputs += chip_bytes(step_batch(step).replay_BLYW)
  one = chip_bytes(scoring_outputs(step, rows))
  held = inputs + ((2 * calls - 1) * one if calls > 1 else 0)
  stages = [
      Stage('behaviour', step.behaviour, (policy, tokens, tokens, *replay), {},
            calls * (2 if step.lag else 1),
            resident_other=step.resident('params', 'base') + held + calls * one * bool(step.lag))
  ]
  if step.ref is not None:  # one function for both passes, as the trainer scores them
    stages.append(
        Stage('reference', step.behaviour, (step.ref, tokens, tokens), {}, calls,
              resident_other=step.resident('reference', 'base') + held + calls * one))
  if step.delta is not None:
    stages.append(delta_stage(step, policy))
  return stages


def delta_stage(step, policy):
  """`Step.delta` on the whole step's rows: the behaviour pass's log-probs, entropies and (held,
  config.delta.hidden) hidden states, the rows' tokens and masks (a recomputing pass's forward
  reads them), the completions, advantages and mask (as `batch.make_batch` passes them). Held
  meanwhile: the rest of the step's batch; recomputing, the pass runs 2K + 2 forwards of the
  policy a scoring chunk at a time (in its program: the compiled FLOPs count them)."""
  c, pop = step.c, step.pop
  G, T = c.rollout.sampling.num_samples, c.rollout.sampling.max_new_tokens
  B = c.rollout.prompts_per_step * G
  f32 = lambda *shape: batch_arg(step, shape, jnp.float32)
  replicated = sharding_lib.replicated(step.mesh)
  state = jax.eval_shape(lambda: pop.stack([step.weighter.init_state()] * pop.n))
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
  behaviour = scoring_outputs(step, B)  # all of it, as `make_batch` passes it
  batch = step_batch(step)  # its rows' tokens, masks and log-probs, held meanwhile
  inputs = dict(tokens_BL=batch.tokens_BL, input_mask_BL=batch.input_mask_BL,
                replay_BLYW=batch.replay_BLYW)
  args = (state, policy, behaviour, inputs, batch_arg(step, (B, T),
                                                      jnp.int32), f32(B), f32(B, T), keys_arg(pop))
  held = chip_bytes((batch.old_logps_BT, batch.ref_logps_BT))
  return Stage('delta', step.delta, args, {}, 1,
               resident_other=step.resident('params', 'base') + held)


def update_stage(step):
  """`Step.update` of one mini-batch, as `update.run_updates` calls it."""
  c, pop = step.c, step.pop
  n = update_lib.num_microbatches(c.optim)
  rows = update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  sh = update_lib.minibatch_sharding(c, step.mesh, pop)
  lead = (pop.n,) * pop.batched + (n, rows)
  leaf = lambda shape, dtype: jax.ShapeDtypeStruct(lead + shape, dtype, sharding=sh)
  f32 = lambda *shape: leaf(shape, jnp.float32)
  batch = update_lib.Batch(
      tokens_BL=leaf((P + T,), jnp.int32), input_mask_BL=leaf(
          (P + T,), jnp.int32), mask_BT=f32(T), advantages_B=f32(), old_logps_BT=f32(T),
      ref_logps_BT=f32(T) if step.ref is not None else None,
      token_weights_BT=f32(T) if c.token_weights else None,
      is_weights_BT=f32(T) if c.rollout.correction != 'none' or
      (c.rollout.policy_lag and c.rollout.policy_lag_mode == 'decoupled') else None,
      replay_BLYW=None if replay_dims(step) is None else leaf(
          (P + T, *replay_dims(step)), jnp.int16))
  hparams = {
      k: jax.ShapeDtypeStruct((pop.n,), jnp.float32, sharding=sharding_lib.replicated(step.mesh))
      for k in pop.varied()
  }
  frozen = () if step.frozen is None else (step.frozen,)  # a LoRA run's base
  return Stage(
      'update', step.update, (step.state, batch, hparams, *frozen), {},
      update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step),
      resident_other=step.resident('params', 'opt_state', 'base') + chip_bytes(step_batch(step)))


def build(step, platform, only=None, free_bytes=None):
  """[`Stage`] of ``step`` on ``platform`` (the devices' platform: the sampler's block size and
  layer loop depend on it); ``only``: the stages of these names (None: all); ``free_bytes``:
  the devices' free memory the samplers' slots and layout follow (None: measured now)."""
  c = step.c
  want = lambda *names: only is None or any(n in only for n in names)
  B = c.rollout.chunk_prompts or c.rollout.prompts_per_step
  calls = c.rollout.prompts_per_step / B
  stages = []
  if want('prefill'):
    stages.append(prefill_stage(step, platform=platform, calls=calls))
  if want('sample'):
    stages.append(
        sampler_stage(step, 'sample',
                      dict(c.rollout.sampling.to_dict(),
                           return_routing=step.sampler_config.is_moe), step.sampler_config,
                      platform=platform, calls=calls, B=B, free_bytes=free_bytes))
  if want('behaviour', 'reference', 'delta'):
    stages += [s for s in scoring_stages(step) if want(s.name)]
  if want('update'):
    stages.append(update_stage(step))
  if c.eval.every and want('eval'):
    batch = c.eval.batch_prompts
    stages.append(
        sampler_stage(step, 'eval', c.eval.sampling.to_dict(), step.infer_config, platform=platform,
                      calls=-(-c.eval.problems // batch) / c.eval.every, B=batch,
                      free_bytes=free_bytes))
  return stages
