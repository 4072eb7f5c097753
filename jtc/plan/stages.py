"""The jitted functions of one RL step, built through the trainer's own code path, with abstract
inputs (`jax.ShapeDtypeStruct`s carrying the config's shardings on the target's devices):
nothing is loaded or allocated.

Stages (each a `Stage`: the jitted function, its abstract arguments, how often it runs in one
RL step and which resident state it does not take as an argument):
  prefill     `jtc.models.decode.prefill` of one sampler call (the prompts' forward pass);
  sample      `jtc.models.sampler` for rollout.chunk_prompts x G rows and T new tokens, with its
              KV cache (prefill and the decode loop: the program the trainer runs);
  behaviour   `rollout.behaviour_pass` (+ hidden states for DelTA) of
              `rollout.score_chunk_prompts` groups (twice under a policy lag: the behaviour and
              the proximal policy);
  reference   the same pass with the frozen reference parameters (kl_coef > 0);
  delta       DelTA's coefficients from the behaviour pass's hidden states;
  update      `update.update_step` of one mini-batch (micro-batches, remat, AdamW state);
  eval        the sampler at the evaluation decoding (eval.batch_prompts prompts a call),
              amortised over eval.every steps.
Every stage holds the state it does not take as an argument meanwhile (`Setup.resident`): the
optimiser state, the KL reference, a policy lag's older parameters.
A population (population.size > 1) adds the member axis to every one of them.
A LoRA run (lora.rank > 0, `jtc.models.lora`) is planned as the trainer runs it: the trained
state is the adapters and their AdamW state (with the member axis), the frozen base is one copy
sharded like full parameters and replicated over the population axis, every pass reads the
policy `lora.Adapted(base, adapters)`, and the KL reference is the base itself (no copy).

Dimension key (docs/dimensions.md): B rows, P prompt width, T new tokens, L = P + T.
"""

import dataclasses
import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import decode
from jtc.models import hf_config
from jtc.models import lora as lora_lib
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib
from jtc.models.model_config import ModelConfig
from jtc.objectives import token_weights
from jtc.rl import checkpoints
from jtc.rl import population as population_lib
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
  unknown_trips: tuple = ()  # trip counts of its non-constant loops (`hlo.program_costs`)
  flops_note: str = 'hlo'


def model_config_for(c, platform: str) -> ModelConfig:
  """The policy's architecture without its weights: a Hugging Face directory's config.json,
  else `policy.preset`, else the jtc bundle's model.json; then the policy section's dtypes,
  remat and attention for ``platform`` (`checkpoints.policy_model_config`)."""
  if c.policy.checkpoint:
    with open(os.path.join(c.policy.checkpoint, 'config.json')) as f:
      base = hf_config.config_from_hf(json.load(f))
  elif c.policy.preset:
    if not hasattr(ModelConfig, c.policy.preset):
      presets = [k for k, v in vars(ModelConfig).items() if isinstance(v, classmethod)]
      raise ValueError(f'config.policy.preset={c.policy.preset!r} is not a ModelConfig preset; '
                       f'valid: {presets}')
    base = getattr(ModelConfig, c.policy.preset)()
  elif c.policy.init:
    from jtc.models import bundles  # pylint: disable=import-outside-toplevel
    with open(os.path.join(bundles.resolve_policy_path(c.policy.init), 'model.json')) as f:
      base = ModelConfig(**json.load(f))
  else:
    raise ValueError('planning needs the architecture: config.policy.preset (e.g. qwen3_8b), '
                     'config.policy.checkpoint or config.policy.init')
  return checkpoints.policy_model_config(c.policy, base, platform)


def chip_bytes(tree) -> float:
  """Bytes per device of a pytree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += float(np.prod(shape)) * np.dtype(x.dtype).itemsize
  return total


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def _batch_sds(mesh, shape, dtype, pop):
  lead = (pop.n,) if pop.batched else ()
  shape = lead + tuple(shape)
  return jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding_lib.batch_sharding(mesh, shape, members=pop.batched))


def _keys(pop):
  """The sampler's keys: uncommitted, as the trainer passes them (split on the host's default
  device), so that a compile here is the one the trainer's call finds."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct((pop.n,) if pop.batched else (), key.dtype)


@dataclasses.dataclass
class Setup:
  """What every stage shares: the config, its model, mesh, population and abstract state."""
  c: Any
  model_config: ModelConfig
  mesh: Any
  pop: Any
  state: Any  # abstract TrainState
  state_sh: Any
  optimizer: Any
  ref_params: Any  # abstract reference params or None
  # The trainer's own jitted functions ('behaviour', 'update') where it passes them
  # (`preflight.check`: compiling those fills the caches its steps then hit), and the sampler's
  # end-of-sequence and pad ids (static arguments: the tokenizer's, for the same reason).
  fns: dict = dataclasses.field(default_factory=dict)
  ids: tuple = (1, 0)
  # A LoRA run's frozen base: abstract `lora.Adapted(base, None)` (None: full fine-tuning).
  frozen: Any = None
  frozen_sh: Any = None

  @property
  def policy(self):
    """What the passes read: the trained params, or a LoRA run's adapters on its base."""
    return self.state.params if self.frozen is None else self.frozen.replace(
        adapters=self.state.params)

  @property
  def base_bytes(self):
    """A LoRA run's frozen base (one copy, whatever the population), 0 without LoRA."""
    return chip_bytes(self.frozen.base) if self.frozen is not None else 0.0

  @property
  def params_bytes(self):
    return chip_bytes(self.state.params)

  @property
  def opt_bytes(self):
    return chip_bytes(self.state.opt_state)

  @property
  def ref_bytes(self):
    """The KL reference's own copy: none under LoRA, whose reference is the base."""
    if self.ref_params is None or self.ref_params is self.frozen:
      return 0.0
    return chip_bytes(self.ref_params)

  @property
  def lagged_bytes(self):
    """rollout.policy_lag older copies of the parameters (`Trainer._copy_params`)."""
    return self.c.rollout.policy_lag * self.params_bytes

  def resident(self, *args_of_stage):
    """Bytes per chip a stage holds besides its arguments: the state (params, opt_state,
    reference, lagged, a LoRA run's base) minus the parts named in ``args_of_stage``."""
    parts = {
        'base': self.base_bytes,
        'params': self.params_bytes,
        'opt_state': self.opt_bytes,
        'reference': self.ref_bytes,
        'lagged': self.lagged_bytes
    }
    return sum(v for k, v in parts.items() if k not in args_of_stage)


def keeps_reference(c, pop) -> bool:
  """Whether the trainer keeps a frozen KL reference: some member's kl_coef > 0."""
  return any(
      dict(m.values).get('loss.hparams.kl_coef', c.loss.hparams.get('kl_coef'))
      for m in pop.members)


def setup(c, devices, platform: str, model_config=None) -> Setup:
  """The abstract train state of config ``c`` on ``devices`` (as `Trainer._build` places it);
  ``model_config`` defaults to `model_config_for` (the trainer passes its own)."""
  pop = population_lib.Population.of(c)
  model_config = model_config or model_config_for(c, platform)
  lora_lib.check_config(c.lora, model_config)
  sizes = sharding_lib.mesh_sizes(**c.mesh, n_devices=len(devices))
  mesh = sharding_lib.make_mesh(**sizes, devices=devices)
  one = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  frozen = frozen_sh = None
  if c.lora.rank:  # as `Trainer._build`: the base frozen, the adapters trained
    frozen, frozen_sh, one = lora_state(c.lora, model_config, one, mesh)
  param_sh = sharding_lib.param_shardings(one, mesh, members=pop.n if pop.batched else 0)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct((pop.n,) * pop.batched + x.shape, x.dtype),
                        one)
  total_updates = c.num_steps * update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step)
  optimizer = update_lib.make_optimizer(c.optim, total_updates)
  replicated = sharding_lib.replicated(mesh)
  state_sh = update_lib.state_shardings(params, optimizer, param_shardings=param_sh,
                                        replicated=replicated, population=pop)
  opt_state = jax.eval_shape(pop.map(optimizer.init), params)
  step = jax.ShapeDtypeStruct((pop.n,) if pop.batched else (), jnp.int32)
  state = _abstract(update_lib.TrainState(step=step, params=params, opt_state=opt_state), state_sh)
  if 'optim.learning_rate' in pop.varied():
    optimizer = functools.partial(update_lib.make_optimizer, c.optim, total_updates)
  ref_params = None
  if keeps_reference(c, pop) and frozen is not None:  # the base alone: no copy
    ref_params = frozen
  elif keeps_reference(c, pop):
    dtype = jnp.dtype(c.policy.ref_param_dtype or model_config.param_dtype)
    ref_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else
                                       x.dtype, sharding=x.sharding), state.params)
  return Setup(c, model_config, mesh, pop, state, state_sh, optimizer, ref_params, frozen=frozen,
               frozen_sh=frozen_sh)


def lora_state(lora, model_config, base, mesh):
  """(abstract frozen `lora.Adapted(base, None)`, its shardings, one member's abstract
  adapters) of a LoRA run: the base sharded as full parameters, without a member axis (so
  replicated over 'population'), as `Trainer._build` places it."""
  base_sh = sharding_lib.param_shardings(base, mesh)
  frozen = lambda tree: lora_lib.Adapted(tree, None, scale=lora_lib.scale(lora))
  adapters = jax.eval_shape(lambda: lora_lib.init_adapters(
      model_config, rank=lora.rank, targets=lora_lib.parse_targets(lora.targets)))
  return frozen(_abstract(base, base_sh)), frozen(base_sh), adapters


def sampler_stage(setup_, name, sampling, model_config, *, platform, calls, B):
  """The sampler program for one call of B prompts, its cache's rows over the batch axes (as
  the trainer's `rollout.Generator` samples)."""
  pop, mesh = setup_.pop, setup_.mesh
  P = setup_.c.data.prompt_width
  r = setup_.c.rollout  # the rollout's scheduler and decode layout ('auto' taken as 'tensor')
  fn, static = sampler_lib.program(
      model_config, P, members=pop.batched, platform=platform, eos_id=setup_.ids[0],
      pad_id=setup_.ids[1], row_sharding=sharding_lib.RowSharding(mesh), num_prompts=B,
      scheduler=r.get('scheduler', 'static'), slots=r.get('decode_slots', None),
      decode_layout=sharding_lib.decode_layout(r.get('decode_layout', 'auto'), mesh, model_config,
                                               None), **sampling)
  args = (setup_.policy, _batch_sds(mesh, (B, P), jnp.int32,
                                    pop), _batch_sds(mesh, (B, P), jnp.int32, pop), _keys(pop))
  if pop.batched:
    args += (None,)
  T, C = sampling['max_new_tokens'], static['block_size']
  return Stage(name, fn, args, static, calls, resident_other=setup_.resident('params', 'base'),
               unknown_trips=(T, (T // C) / 2 + 1), flops_note='hlo, loops at T tokens')


def prefill_stage(setup_, model_config, *, platform, calls):
  """`decode.prefill` of one sampler call: the prompts' forward pass and the cache it fills."""
  c, pop, mesh = setup_.c, setup_.pop, setup_.mesh
  B = c.rollout.chunk_prompts or c.rollout.prompts_per_step
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  block = sampler_lib.resolve_block_size(None, T, platform)
  prefill = functools.partial(decode.prefill, config=model_config,
                              num_samples=c.rollout.sampling.num_samples, max_new_tokens=T,
                              block_size=block, row_sharding=sharding_lib.RowSharding(mesh))
  fn = jax.jit(pop.map(lambda p, t, m: prefill(p, prompt_tokens_BP=t, prompt_mask_BP=m), spmd=True))
  args = (setup_.policy, _batch_sds(mesh, (B, P), jnp.int32,
                                    pop), _batch_sds(mesh, (B, P), jnp.int32, pop))
  return Stage('prefill', fn, args, {}, calls, resident_other=setup_.resident('params', 'base'))


def scoring_stages(setup_, infer_config):
  """The behaviour pass, the reference pass (kl_coef > 0) and DelTA's coefficients."""
  c, pop, mesh = setup_.c, setup_.pop, setup_.mesh
  G, P, T = c.rollout.sampling.num_samples, c.data.prompt_width, c.rollout.sampling.max_new_tokens
  rows = (rollout_lib.score_chunk_prompts(c.rollout) or c.rollout.prompts_per_step) * G
  calls = c.rollout.prompts_per_step * G / rows
  delta = c.token_weights == 'delta'
  # One function for both passes, as the trainer scores the reference with its behaviour pass.
  fn = setup_.fns.get('behaviour') or rollout_lib.jit_behaviour(
      infer_config, completion_start=P, return_hidden=delta, population=pop, mesh=mesh)
  tokens = _batch_sds(mesh, (rows, P + T), jnp.int32, pop)
  stages = [
      Stage('behaviour', fn, (setup_.policy, tokens, tokens), {},
            calls * (2 if c.rollout.policy_lag else 1),
            resident_other=setup_.resident('params', 'base'))
  ]
  if setup_.ref_params is not None:
    stages.append(
        Stage('reference', fn, (setup_.ref_params, tokens, tokens), {}, calls,
              resident_other=setup_.resident('reference', 'base')))
  if delta:
    weighter = token_weights.PLUGINS['delta'].from_config(c.delta, group_size=G,
                                                          model_config=setup_.model_config)
    B = c.rollout.prompts_per_step * G
    f32 = lambda *shape: _batch_sds(mesh, shape, jnp.float32, pop)
    state = jax.eval_shape(lambda: pop.stack([weighter.init_state()] * pop.n))
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_lib.replicated(mesh)),
        state)
    behaviour = {
        'logps': f32(B, T),
        'entropy': f32(B, T),
        'hidden': _batch_sds(mesh, (B, T, setup_.model_config.d_model), infer_config.jnp_dtype, pop)
    }
    args = (state, setup_.policy, behaviour, _batch_sds(mesh, (B, T), jnp.int32,
                                                        pop), f32(B), f32(B, T), _keys(pop))
    stages.append(
        Stage('delta', jax.jit(pop.map(weighter.weights)), args, {}, 1,
              resident_other=setup_.resident('params', 'base')))
  return stages


def update_stage(setup_):
  """`update.update_step` of one mini-batch, jitted as the trainer jits it."""
  c, pop, mesh = setup_.c, setup_.pop, setup_.mesh
  update_fn = setup_.fns.get('update') or update_lib.jit_minibatch_and_update(
      c, setup_.model_config, setup_.optimizer, mesh, setup_.state_sh, pop, setup_.frozen_sh)[1]
  n = update_lib.num_microbatches(c.optim)
  rows = update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  sh = update_lib.minibatch_sharding(c, mesh, pop)
  lead = (pop.n,) * pop.batched + (n, rows)
  leaf = lambda shape, dtype: jax.ShapeDtypeStruct(lead + shape, dtype, sharding=sh)
  f32 = lambda *shape: leaf(shape, jnp.float32)
  batch = update_lib.Batch(
      tokens_BL=leaf((P + T,), jnp.int32), input_mask_BL=leaf(
          (P + T,), jnp.int32), mask_BT=f32(T), advantages_B=f32(), old_logps_BT=f32(T),
      ref_logps_BT=f32(T) if setup_.ref_params is not None else None,
      token_weights_BT=f32(T) if c.token_weights else None,
      is_weights_BT=f32(T) if c.rollout.correction != 'none' or
      (c.rollout.policy_lag and c.rollout.policy_lag_mode == 'decoupled') else None)
  hparams = {
      k: jax.ShapeDtypeStruct((pop.n,), jnp.float32, sharding=sharding_lib.replicated(mesh))
      for k in pop.varied()
  }
  frozen = () if setup_.frozen is None else (setup_.frozen,)  # a LoRA run's base
  return Stage('update', update_fn, (setup_.state, batch, hparams, *frozen), {},
               update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step),
               resident_other=setup_.resident('params', 'opt_state', 'base'))


def build(c, devices, platform: str, model_config=None, fns=None, ids=(1, 0)):
  """(`Setup`, [`Stage`]) of one RL step of config ``c`` on ``devices`` of ``platform``; ``fns``
  and ``ids`` as `Setup`'s."""
  s = dataclasses.replace(setup(c, devices, platform, model_config), fns=fns or {}, ids=ids)
  infer_config = dataclasses.replace(s.model_config, remat=False)
  sampler_config = infer_config
  if c.rollout.sampler_dtype:
    sampler_config = dataclasses.replace(infer_config, dtype=c.rollout.sampler_dtype)
  B = c.rollout.chunk_prompts or c.rollout.prompts_per_step
  calls = c.rollout.prompts_per_step / B
  stages = [
      prefill_stage(s, sampler_config, platform=platform, calls=calls),
      sampler_stage(s, 'sample', c.rollout.sampling.to_dict(), sampler_config, platform=platform,
                    calls=calls, B=B),
      *scoring_stages(s, infer_config),
      update_stage(s),
  ]
  if c.eval.every:
    batch = c.eval.batch_prompts  # as `Trainer._evaluate` batches the problems
    eval_calls = -(-c.eval.problems // batch) / c.eval.every
    stages.append(
        sampler_stage(s, 'eval', c.eval.sampling.to_dict(), infer_config, platform=platform,
                      calls=eval_calls, B=batch))
  return s, stages
