"""Compile every stage of one RL step for a target and report memory, FLOPs, collectives and
estimated times per chip (`plan`), the fit verdict, and the table (`format_table`).

Time per call is a roofline *estimate*: max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth,
collective bytes / interconnect bandwidth), with the chip's published constants
(`hardware.CHIPS`); MFU = the step's FLOPs / (step time x peak).
"""

import dataclasses
import json
import os

import jax

from jtc.models.model_config import ModelConfig
from jtc.plan import hardware
from jtc.plan import hlo
from jtc.rl import checkpoints
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

  @property
  def capacity(self):
    return self.chip.hbm_bytes

  @property
  def worst(self):
    return max(self.rows, key=lambda r: r.peak) if self.rows else None

  @property
  def fits(self):
    return not self.failure and all(r.peak <= self.capacity for r in self.rows)

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


def roofline_seconds(costs: hlo.Costs, chip: hardware.Chip) -> float:
  """Estimated seconds of one call: the slowest of compute, HBM traffic and collectives."""
  return max(costs.flops / chip.peak_flops, costs.hbm_bytes / chip.hbm_bandwidth,
             costs.total_collective_bytes / chip.link_bandwidth)


def stage_costs(lowered, compiled, n_devices, unknown_trips=(), decode_steps=0):
  """Per-chip `hlo.Costs`: collective bytes of the compiled program; FLOPs of the lowered one
  (global matmuls, before the TPU compiler rewrites them as convolutions) / chips; HBM traffic
  from the compiled sizes: arguments, outputs and temporaries touched once, and for a decode
  loop of ``decode_steps`` steps the arguments (weights) and half the temporaries (the live
  half of the KV cache, on average) once per step."""
  costs = hlo.program_costs(compiled.as_text(), unknown_trips=unknown_trips)
  costs.flops = hlo.program_costs(lowered.as_text(dialect='hlo'),
                                  unknown_trips=unknown_trips).flops / n_devices
  mem = compiled.memory_analysis()
  once = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
  per_step = mem.argument_size_in_bytes + mem.temp_size_in_bytes / 2
  costs.hbm_bytes = float(once + decode_steps * per_step)
  return costs


def _row(stage, lowered, compiled, seconds, chip, n_devices):
  mem = compiled.memory_analysis()
  costs = stage_costs(lowered, compiled, n_devices, stage.unknown_trips,
                      stage.unknown_trips[0] if stage.unknown_trips else 0)
  return Row(stage.name, stage.calls, mem.argument_size_in_bytes, mem.output_size_in_bytes,
             mem.temp_size_in_bytes, mem.generated_code_size_in_bytes,
             mem.alias_size_in_bytes, stage.resident_other, costs, stage.flops_note, seconds,
             roofline_seconds(costs, chip), in_total=stage.in_total)


def plan(c, devices, *, platform, chip, target, compiled_for, only=None, log=None,
         stop_early=False):
  """Compiles the stages of config ``c`` on ``devices`` and returns a `Plan`. A stage the
  compiler refuses for memory ends the plan with that refusal as its verdict; with
  ``stop_early`` so does the first stage that does not fit (`--suggest`: the rest need not
  compile)."""
  step = build_step(c, devices, platform)
  parts = step.resident_parts()
  resident = {
      **({
          'frozen base': parts['base']
      } if step.frozen is not None else {}), 'params':
          parts['params'],
      'opt_state':
          parts['opt_state'],
      'reference':
          parts['reference'],
      'lagged params':
          parts['lagged']
  }
  result = Plan(target, chip, len(devices), dict(step.mesh.shape), [], resident, compiled_for)
  stages = step.stages(platform)
  for stage in stages:
    if only and stage.name not in only:
      continue
    try:
      lowered, compiled, seconds = stage.compile()
    except jax.errors.JaxRuntimeError as e:
      if 'RESOURCE_EXHAUSTED' not in str(e):
        raise
      result.failure = (f'does not fit: stage {stage.name!r}: the compiler refused it: '
                        f'{str(e).splitlines()[0][:300]}')
      result.refused_stage = stage.name
      break
    row = _row(stage, lowered, compiled, seconds, chip, len(devices))
    result.rows.append(row)
    if log:
      log(f'compiled {stage.name} in {seconds:.1f} s: peak {row.peak / GIB:.2f} GiB per chip')
    if stop_early and row.peak > result.capacity:
      break
  return result


def _gib(x):
  return f'{x / GIB:.2f}'


def format_table(p: Plan) -> str:
  """The per-stage table, the resident state and the RL-step totals, as text."""
  head = (f'plan: {p.target} ({p.n_devices} x {p.chip.name}, {_gib(p.capacity)} GiB HBM each), '
          f'mesh {p.mesh}; {p.compiled_for}')
  cols = ('stage', 'calls/step', 'args GiB', 'out GiB', 'temp GiB', 'code MiB', '+resident GiB',
          'peak GiB', 'HBM %', 'TFLOP/chip', 'flops', 'AG GiB', 'RS GiB', 'AR GiB', 'A2A GiB',
          'est. s/call', 'compile s')
  lines = [head, ' | '.join(cols), ' | '.join('---' for _ in cols)]
  for r in p.rows:
    cb = r.costs.collective_bytes
    lines.append(' | '.join([
        r.stage if r.in_total else f'{r.stage} (inside sample)', f'{r.calls:g}',
        _gib(r.arguments),
        _gib(r.outputs),
        _gib(r.temporaries), f'{r.code / 2**20:.0f}',
        _gib(r.resident_other),
        _gib(r.peak), f'{100 * r.peak / p.capacity:.0f}', f'{r.costs.flops / 1e12:.3g}',
        r.flops_note,
        _gib(cb['all-gather']),
        _gib(cb['reduce-scatter']),
        _gib(cb['all-reduce']),
        _gib(cb['all-to-all']), f'{r.seconds:.3g}', f'{r.compile_s:.1f}'
    ]))
  res = ', '.join(f'{k} {_gib(v)} GiB' for k, v in p.resident.items())
  lines.append(f'resident per chip across stages: {res}')
  lines.append(f'RL step (estimate, roofline at published peaks: {p.chip.source}): '
               f'{p.step_seconds:.4g} s per step, MFU {100 * p.mfu:.1f} % '
               f'({p.step_flops / 1e12:.4g} TFLOP per chip per step)')
  lines.append('flops: matmul FLOPs of the lowered HLO / chips, each loop body counted as often '
               "as it runs ('loops at T tokens': the decode loop at max_new_tokens); bytes and "
               'collectives (AG all-gather, RS reduce-scatter, AR all-reduce, A2A all-to-all) '
               'from the compiled HLO, per chip; HBM traffic from the compiled sizes (a decode '
               'loop reads the weights and the live half of its cache every step)')
  verdict = p.verdict()
  lines.append(verdict if verdict else f'fits: the largest stage peaks at {_gib(p.worst.peak)} '
               f'GiB of {_gib(p.capacity)} GiB per chip ({p.worst.stage})')
  return '\n'.join(lines)
