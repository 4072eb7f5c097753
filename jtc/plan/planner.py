"""Compile every stage of one RL step for a target and report memory, FLOPs, collectives and
estimated times per chip (`plan`) and the fit verdict (the text a user reads: `jtc.plan.table`).

Time per call is a roofline *estimate*: max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth,
collective bytes / interconnect bandwidth), with the chip's published constants
(`hardware.CHIPS`); MFU = the step's FLOPs / (step time x peak).
"""

import dataclasses
import json
import os
import time
from typing import Any

import jax

from jtc.models import moe_dispatch
from jtc.models.model_config import ModelConfig
from jtc.plan import hardware
from jtc.plan import hlo
from jtc.rl import checkpoints
from jtc.rl import decoding as decoding_lib
from jtc.rl import preflight
from jtc.rl import sharding as sharding_lib
from jtc.rl import step as step_lib

GIB = hardware.GIB


@dataclasses.dataclass
class Row:
  """One compiled stage, per chip."""
  stage: str
  calls: float
  arguments: float
  outputs: float
  temporaries: float
  code: float
  aliased: float
  resident_other: float
  costs: hlo.Costs
  flops_note: str
  compile_s: float
  seconds: float  # estimated per call
  in_total: bool = True
  bound: str = ''  # the roofline term that sets ``seconds``: 'compute', 'HBM' or 'link'

  @property
  def peak(self):
    return (self.arguments + self.outputs - self.aliased + self.temporaries + self.code +
            self.resident_other)


@dataclasses.dataclass
class Plan:
  target: str
  chip: hardware.Chip
  n_devices: int
  mesh: dict
  rows: list
  resident: dict  # (frozen base /) params / opt_state / reference bytes per chip
  compiled_for: str  # what compiled the programs
  failure: str = ''  # the compiler's refusal, if any
  refused_stage: str = ''  # the stage the compiler refused
  compile_s: float = 0.0  # every compile of this plan, a refused one included
  stages: tuple = ()  # the names of every stage of the step, compiled or not
  decoding: Any = None  # the sample stage's `jtc.rl.decoding.Decoding` (slots, layout), if any

  @property
  def complete(self):
    """Every stage the step's time counts compiled (not limited by --stages, not ended early
    by a stage that does not fit or that the compiler refused)."""
    done = {r.stage for r in self.rows}
    return not self.failure and all(n in done for n in self.stages if n != 'prefill')

  @property
  def capacity(self):
    return self.chip.hbm_bytes

  @property
  def worst(self):
    return max(self.rows, key=lambda r: r.peak) if self.rows else None

  @property
  def fits(self):
    return not self.failure and bool(self.rows) and all(r.peak <= self.capacity for r in self.rows)

  @property
  def step_seconds(self):
    return sum(r.calls * r.seconds for r in self.rows if r.in_total)

  @property
  def step_flops(self):
    return sum(r.calls * r.costs.flops for r in self.rows if r.in_total)

  @property
  def mfu(self):
    return self.step_flops / max(self.step_seconds * self.chip.peak_flops, 1e-30)

  @property
  def failed_stage(self):
    """The stage that does not fit ('' when every stage fits): the one the compiler refused, else
    the first over the chip's memory."""
    over = [r.stage for r in self.rows if r.peak > self.capacity]
    return self.refused_stage or (over[0] if over else '')

  def verdict(self):
    """'' when every stage fits, else the `does not fit` line naming the worst stage."""
    if self.failure:
      return self.failure
    if not self.rows:
      return 'nothing compiled (no stage of --stages in this step)'
    worst = self.worst
    if worst.peak > self.capacity:
      return preflight.does_not_fit(worst.stage, worst.peak, self.capacity,
                                    f'{self.chip.name}, {self.target}')
    return ''


def model_config_for(c, platform: str) -> ModelConfig:
  """The policy's architecture without its weights: a Hugging Face directory's config.json,
  else `policy.preset`, else the jtc bundle's model.json; then the policy section's dtypes,
  remat and attention for ``platform`` (`checkpoints.policy_model_config`)."""
  from jtc.models import hf_config  # pylint: disable=import-outside-toplevel
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


def build_step(c, devices, platform: str, model_config=None):
  """The trainer's `jtc.rl.step.Step` of config ``c`` on ``devices``, abstract (nothing is
  loaded or allocated); ``model_config`` defaults to `model_config_for`."""
  sizes = sharding_lib.mesh_sizes(**c.mesh, n_devices=len(devices))
  mesh = sharding_lib.make_mesh(**sizes, devices=devices)
  return step_lib.build(c, mesh, model_config or model_config_for(c, platform))


# Every stage a step can have, in the order it runs (`jtc.rl.stages.build`).
STAGES = ('prefill', 'sample', 'behaviour', 'reference', 'delta', 'update', 'eval')


def stage_names(c, devices, platform: str, model_config=None):
  """The names of the stages config ``c``'s step runs on ``devices`` (nothing compiles)."""
  step = build_step(c, devices, platform, model_config)
  return tuple(s.name for s in step.stages(platform))


def roofline(costs: hlo.Costs, chip: hardware.Chip):
  """(estimated seconds of one call, what bounds it): the slowest of compute ('compute'), HBM
  traffic ('HBM') and collectives over the chips' links ('link')."""
  terms = {
      'compute': costs.flops / chip.peak_flops,
      'HBM': costs.hbm_bytes / chip.hbm_bandwidth,
      'link': costs.total_collective_bytes / chip.link_bandwidth
  }
  bound = max(terms, key=terms.get)
  return terms[bound], bound


def roofline_seconds(costs: hlo.Costs, chip: hardware.Chip) -> float:
  """Estimated seconds of one call: the slowest of compute, HBM traffic and collectives."""
  return roofline(costs, chip)[0]


def check_stages(names):
  """A ValueError naming each of ``names`` (a --stages list) that is no stage, with the valid
  ones."""
  unknown = [n for n in names if n not in STAGES]
  if unknown:
    raise ValueError(f'--stages: unknown stage{"s" * (len(unknown) > 1)} '
                     f'{", ".join(map(repr, unknown))}; valid: {", ".join(STAGES)}')


def flops_lowering(stage, lowered, platform, model_config):
  """The lowered program whose matmuls `stage_costs` counts: ``lowered`` (the compiled one's),
  but for a mixture of experts planned for a GPU (compiled for the host CPU) the stage lowered
  for CUDA, where `jax.lax.ragged_dot` stays a grouped matmul: XLA:CPU's lowering of it is a
  masked dense product over every expert (X times the routed rows' FLOPs). Inside the stage's
  mesh context, as it compiles."""
  if platform != 'gpu' or not model_config.is_moe:
    return lowered
  return stage.fn.trace(*stage.args, **stage.kwargs).lower(lowering_platforms=('cuda',))


def stage_costs(lowered, compiled, n_devices, unknown_trips=(), decode_steps=0, flops_lowered=None):
  """Per-chip `hlo.Costs`: collective bytes of the compiled program; FLOPs of the lowered one
  (global matmuls, before the TPU compiler rewrites them as convolutions; ``flops_lowered``
  instead where given, `flops_lowering`) / chips; HBM traffic from the compiled sizes:
  arguments, outputs and temporaries touched once, and for a decode loop of ``decode_steps``
  steps the arguments (weights) and half the temporaries (the live half of the KV cache, on
  average) once per step."""
  costs = hlo.program_costs(compiled.as_text(), unknown_trips=unknown_trips)
  costs.flops = hlo.program_costs((flops_lowered or lowered).as_text(dialect='hlo'),
                                  unknown_trips=unknown_trips).flops / n_devices
  mem = compiled.memory_analysis()
  once = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
  per_step = mem.argument_size_in_bytes + mem.temp_size_in_bytes / 2
  costs.hbm_bytes = float(once + decode_steps * per_step)
  return costs


def _row(stage, lowered, compiled, seconds, chip, n_devices, flops_lowered=None):
  mem = compiled.memory_analysis()
  costs = stage_costs(lowered, compiled, n_devices, stage.unknown_trips,
                      stage.unknown_trips[0] if stage.unknown_trips else 0, flops_lowered)
  per_call, bound = roofline(costs, chip)
  return Row(stage.name, stage.calls, mem.argument_size_in_bytes, mem.output_size_in_bytes,
             mem.temp_size_in_bytes, mem.generated_code_size_in_bytes, mem.alias_size_in_bytes,
             stage.resident_other, costs, stage.flops_note, seconds, per_call,
             in_total=stage.in_total, bound=bound)


def plan(c, devices, *, platform, chip, target, compiled_for, only=None, log=None,
         stop_early=False):
  """Compiles the stages of config ``c`` on ``devices`` and returns a `Plan`. A stage the
  compiler refuses for memory ends the plan with that refusal as its verdict; with
  ``stop_early`` so does the first stage that does not fit (`--suggest`: the rest need not
  compile). ``only``: these stages alone, among those the step runs (a ValueError names one
  that is no stage; `stage_names` says which the step runs)."""
  check_stages(only or ())
  step = build_step(c, devices, platform)
  parts = step.resident_parts()
  resident = {'params': parts['params'], 'opt_state': parts['opt_state']}
  if step.frozen is not None:
    resident = {'frozen base': parts['base'], **resident}
  resident.update({'reference': parts['reference'], 'lagged params': parts['lagged']})
  # The sampler's slots and layout follow the memory its first call finds: the chips' less the
  # resident state.
  stages = step.stages(
      platform, free_bytes=decoding_lib.planned_free_bytes(chip.hbm_bytes, step.resident(),
                                                           len(devices)))
  result = Plan(target, chip, len(devices), dict(step.mesh.shape), [], resident, compiled_for,
                stages=tuple(s.name for s in stages), decoding=next(
                    (s.decoding for s in stages if s.name == 'sample'), None))
  for stage in stages:
    if only and stage.name not in only:
      continue
    t0 = time.perf_counter()
    try:
      with moe_dispatch.mesh_context(step.mesh, step.model_config):  # an all-to-all's mesh
        lowered, compiled, seconds = stage.compile()
        flops_lowered = flops_lowering(stage, lowered, platform, step.model_config)
    except jax.errors.JaxRuntimeError as e:
      result.compile_s += time.perf_counter() - t0
      if 'RESOURCE_EXHAUSTED' not in str(e):
        raise
      result.failure = (f'does not fit: stage {stage.name!r}: the compiler refused it: '
                        f'{str(e).splitlines()[0][:300]}')
      result.refused_stage = stage.name
      break
    result.compile_s += seconds
    row = _row(stage, lowered, compiled, seconds, chip, len(devices), flops_lowered)
    result.rows.append(row)
    if log:
      log(f'compiled {stage.name} in {seconds:.1f} s: peak {row.peak / GIB:.2f} GiB per chip')
    if stop_early and row.peak > result.capacity:
      break
  return result
