r"""The RL step of a config, built once: what the trainer runs and the planner compiles.

  step = step_lib.build(config, mesh, model_config)              # abstract: nothing allocated
  state, frozen, reference = step.materialise(params)             # the trainer: on the devices
  for stage in step.stages(platform): stage.compile()             # the planner and the preflight

`build` is the one place where a run's state and its jitted functions are decided: the train
state's structure and shardings (`update.TrainState`, a population's member axis), a LoRA run's
frozen base (one copy, replicated over 'population'), the KL reference (none, a frozen copy, or
under LoRA the base itself), the policy lag's older copies, the optimiser (a traced learning rate
when members vary it) and the jitted functions of every stage: the behaviour (and reference)
pass, the token-weight plug-in (DelTA), the mini-batch slicer and the update. `jtc.rl.stages`
gives each stage its abstract arguments (prefill, sample, behaviour, reference, delta, update,
eval), so `python -m jtc.plan`, `--suggest`, the analytic estimate (`jtc.plan.estimate`, which
reads the same shapes), the trainer's own preflight (`jtc.rl.preflight`) and the benchmarks
compile exactly the functions the trainer's steps call (tests/rl/test_step.py compares them).

Adding to the step (a new stage, state or rule: MoE routing, hybrid layers, partial rollouts):
  * state the step holds (a cache, a router's replay buffer): a field of `Step`, decided in
    `build` from the config and the abstract parameters, placed in `Step.materialise`, its
    bytes per chip in `Step.resident_parts` (what every stage holds besides its arguments);
  * a jitted function the trainer calls: built in `build` (jit it here, once), called by the
    trainer through the step (``step.fn``);
  * a stage the planner compiles: a builder in `jtc.rl.stages` returning a `stages.Stage` (the
    function above, its abstract arguments, runs per RL step, the state parts among its
    arguments), listed in `stages.build`; the preflight checks it when it is in
    `preflight.STAGES`; `suggest.STAGE_KEYS` names the keys its program depends on.
Nothing under jtc/rl imports jtc/plan (tests/rl/test_step.py).

Dimension key (docs/dimensions.md): E population members.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import lora as lora_lib
from jtc.models import model as model_lib
from jtc.objectives import delta_recompute
from jtc.objectives import token_weights
from jtc.rl import checkpoints
from jtc.rl import population as population_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import stages as stages_lib
from jtc.rl import update as update_lib


def keeps_reference(c, population) -> bool:
  """Whether the step keeps a KL reference policy: some member's kl_coef > 0."""
  return any(
      population.value(m, 'loss.hparams.kl_coef', c.loss.hparams.get('kl_coef'))
      for m in population.members)


def abstract(tree, shardings):
  """``tree``'s shapes and dtypes as ShapeDtypeStructs placed with ``shardings``."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


@dataclasses.dataclass
class Step:
  """One RL step of config ``c``: its abstract state (ShapeDtypeStructs carrying their
  shardings) and its jitted functions; `build` makes it, `materialise` places a policy in it,
  `stages` lists its programs with their abstract arguments."""
  c: Any
  model_config: Any  # the policy as trained (the update: remat as configured)
  infer_config: Any  # sampling, scoring and evaluation: no rematerialisation
  sampler_config: Any  # the rollouts' sampler (rollout.sampler_dtype may differ)
  mesh: Any
  pop: population_lib.Population
  optimizer: Any  # initialises the state (a member's learning rate is traced in `update`)
  state: update_lib.TrainState  # abstract, with the member axis of a population
  state_sh: update_lib.TrainState
  frozen: Any  # a LoRA run's abstract base `lora.Adapted(base, None)`, else None
  frozen_sh: Any
  reference: str  # the KL reference: '' none, 'base' (LoRA: the base itself), 'copy'
  ref_dtype: Any  # the reference copy's float dtype
  lag: int  # rollout.policy_lag: older copies of the parameters the step keeps
  weighter: Any  # the token-weight plug-in (`token_weights.PLUGINS`) or None
  ids: tuple  # the sampler's (end-of-sequence id, pad id): the tokenizer's
  behaviour: Any  # jitted `rollout.behaviour_pass`: fn(policy, tokens_BL, input_mask_BL)
  minibatch: Any  # jitted `update.minibatch` (out_shardings: the mini-batch's)
  update: Any  # jitted `update.update_step` (state donated; a LoRA run's base as 4th argument)
  delta: Any  # jitted token weights of ``weighter`` (mapped over members), or None

  def policy(self, params):
    """What the passes read: ``params`` themselves, or a LoRA run's adapters on its base."""
    return params if self.frozen is None else self.frozen.replace(adapters=params)

  @property
  def ref(self):
    """The abstract KL reference policy, or None."""
    if self.reference == 'base':
      return self.frozen
    if self.reference == 'copy':
      cast = lambda x: self.ref_dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, cast(x), sharding=x.sharding),
                          self.state.params)
    return None

  def resident_parts(self) -> dict:
    """Bytes per chip of the state every stage holds: 'base' (LoRA's frozen base, one copy for
    every member), 'params', 'opt_state', 'reference' (a copy; none under LoRA) and 'lagged'."""
    params = stages_lib.chip_bytes(self.state.params)
    return {
        'base': stages_lib.chip_bytes(self.frozen.base) if self.frozen is not None else 0.0,
        'params': params,
        'opt_state': stages_lib.chip_bytes(self.state.opt_state),
        'reference': stages_lib.chip_bytes(self.ref) if self.reference == 'copy' else 0.0,
        'lagged': self.lag * params,
    }

  def resident(self, *holds) -> float:
    """Bytes per chip of the resident state but the parts named in ``holds`` (a stage's own
    arguments)."""
    return sum(v for k, v in self.resident_parts().items() if k not in holds)

  def stages(self, platform, free_bytes=None):
    """The step's programs with their abstract arguments (`jtc.rl.stages.build`; ``free_bytes``:
    the devices' free memory its samplers' decoding follows, None: measured now)."""
    return stages_lib.build(self, platform, free_bytes=free_bytes)

  def materialise(self, params):
    """(state, frozen base or None, KL reference or None) on the mesh from one member's host
    ``params`` (the full policy): a LoRA run places them as its frozen base and trains fresh
    adapters; a population's members start from the same parameters."""
    frozen = None
    if self.frozen is not None:
      frozen = self.frozen_sh.replace(
          base=jax.tree.map(sharding_lib.to_device, params, self.frozen_sh.base))
      params = jax.device_get(  # what is trained (and checkpointed): the adapters alone
          lora_lib.init_adapters(self.model_config, rank=self.c.lora.rank,
                                 targets=lora_lib.parse_targets(self.c.lora.targets)))
    state, _ = update_lib.init_state(params, self.optimizer, param_shardings=self.state_sh.params,
                                     replicated=sharding_lib.replicated(self.mesh),
                                     population=self.pop)
    reference = {'': None, 'base': frozen}.get(self.reference)
    if self.reference == 'copy':  # a frozen copy, never aliased with the donated state
      reference = checkpoints.frozen_copy(state.params, self.ref_dtype, self.state_sh.params)
    return state, frozen, reference

  def copy_params(self, params):
    """``params`` in new buffers (a lagged copy: the update donates the state's)."""
    return checkpoints.frozen_copy(params, self.model_config.param_dtype, self.state_sh.params)


def build(c, mesh, model_config, *, params=None, schedule_steps=None, ids=(1, 0)) -> Step:
  """The `Step` of config ``c`` on ``mesh`` (a `jax.sharding.Mesh`, or an `AbstractMesh` for the
  shapes alone) for the policy ``model_config``.

  ``params``: one member's full parameters, arrays or ShapeDtypeStructs (None: their shapes
  from `model.init_params`); ``schedule_steps``: the RL steps of the learning-rate schedule
  (None: c.num_steps; a resumed run keeps its first); ``ids``: the tokenizer's (eos, pad)."""
  pop = population_lib.Population.of(c)
  lora_lib.check_config(c.lora, model_config)  # the rank against the model's dimensions
  if params is None:
    params = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), params)
  total_updates = (schedule_steps or c.num_steps) * update_lib.updates_per_step(
      c.optim, c.rollout.prompts_per_step)
  optimizer = update_lib.make_optimizer(c.optim, total_updates)
  frozen = frozen_sh = None
  if c.lora.rank:  # the base frozen (one copy for every member), the adapters trained
    frozen_sh = lora_lib.Adapted(sharding_lib.param_shardings(params, mesh), None,
                                 scale=lora_lib.scale(c.lora))
    frozen = abstract(frozen_sh.replace(base=params), frozen_sh)
    params = jax.eval_shape(lambda: lora_lib.init_adapters(
        model_config, rank=c.lora.rank, targets=lora_lib.parse_targets(c.lora.targets)))
  param_sh = sharding_lib.param_shardings(params, mesh, members=pop.n if pop.batched else 0)
  lead = (pop.n,) if pop.batched else ()
  stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct(lead + x.shape, x.dtype), params)
  replicated = sharding_lib.replicated(mesh)
  state_sh = update_lib.state_shardings(stacked, optimizer, param_shardings=param_sh,
                                        replicated=replicated, population=pop)
  state = abstract(
      update_lib.TrainState(step=jax.ShapeDtypeStruct(lead, jnp.int32), params=stacked,
                            opt_state=jax.eval_shape(pop.map(optimizer.init), stacked)), state_sh)
  reference = ''
  if keeps_reference(c, pop):  # with LoRA the reference is the base alone: free
    reference = 'base' if frozen is not None else 'copy'
  infer_config = dataclasses.replace(model_config, remat=False)  # no gradient: no remat
  sampler_config = infer_config  # the sampler's compute dtype may differ (a planted mismatch)
  if c.rollout.sampler_dtype:
    sampler_config = dataclasses.replace(infer_config, dtype=c.rollout.sampler_dtype)
  weighter = token_weighter(c, model_config, infer_config, mesh)
  # A member's learning rate, when members vary it, is traced: the update builds its optimiser.
  update_optimizer = (functools.partial(update_lib.make_optimizer, c.optim, total_updates)
                      if 'optim.learning_rate' in pop.varied() else optimizer)
  minibatch, update = update_lib.jit_minibatch_and_update(c, model_config, update_optimizer, mesh,
                                                          state_sh, pop, frozen_sh)
  behaviour = rollout_lib.jit_behaviour(infer_config, completion_start=c.data.prompt_width,
                                        return_hidden=bool(weighter and weighter.needs_hidden),
                                        population=pop, mesh=mesh)
  return Step(c=c, model_config=model_config, infer_config=infer_config,
              sampler_config=sampler_config, mesh=mesh, pop=pop, optimizer=optimizer, state=state,
              state_sh=state_sh, frozen=frozen, frozen_sh=frozen_sh, reference=reference,
              ref_dtype=jnp.dtype(c.policy.ref_param_dtype or model_config.param_dtype),
              lag=c.rollout.policy_lag, weighter=weighter, ids=tuple(ids), behaviour=behaviour,
              minibatch=minibatch, update=update, delta=_jit_weights(weighter, pop, mesh))


def token_weighter(c, model_config, infer_config, mesh):
  """The token-weight plug-in of ``c`` (`token_weights.PLUGINS`) or None; it may recompute the
  behaviour pass's hidden states (config.delta.hidden): that pass's forward, a scoring chunk's
  rows at a time."""
  if not c.token_weights:
    return None
  G, rows = c.rollout.sampling.num_samples, sharding_lib.RowSharding(mesh)
  forward = functools.partial(delta_recompute.behaviour_forward, model_config=infer_config,
                              completion_start=c.data.prompt_width, row_sharding=rows)
  return token_weights.PLUGINS[c.token_weights].from_config(
      c.delta, group_size=G, model_config=model_config, row_sharding=rows, forward=forward,
      chunk_rows=rollout_lib.score_chunk_prompts(c.rollout) * G)


def _jit_weights(weighter, pop, mesh):
  """The plug-in's ``weights`` jitted over the members: the token weights over the batch axes
  (as the rollouts), its metrics and state replicated."""
  if weighter is None:
    return None
  rows = lambda x: sharding_lib.batch_sharding(mesh, x.shape, members=pop.batched)
  replicated = sharding_lib.replicated(mesh)

  def weights(state, policy, behaviour, inputs, completion_BT, adv_B, mask_BT, rng):
    # spmd: the rows' constraints inside map the members over the 'population' axis.
    weights_BT, metrics, state = pop.map(weighter.weights,
                                         spmd=True)(state, policy, behaviour, inputs, completion_BT,
                                                    adv_B, mask_BT, rng)
    weights_BT = jax.lax.with_sharding_constraint(weights_BT, rows(weights_BT))
    return weights_BT, metrics, jax.lax.with_sharding_constraint(state, replicated)

  return jax.jit(weights)
