"""The decoding settings of a rollout's sampler call, resolved from config.rollout and the devices'
free memory: the scheduler, the continuous scheduler's decode slots and the weights' decode
layout. The step's sample stage compiles them (`jtc.rl.stages`) and `jtc plan` prints them; the
trainer's sampler resolves the same rules at its first call (`decode_loop.default_slots`,
`sharding.decode_layout_choice`) from the memory its devices then report.

Slots: config.rollout.decode_slots (clipped to the call's rows), else `decode_loop.default_slots`:
the rows whose completion cache fits in half the free memory. Free memory: measured on the
devices (the trainer), or for a plan the chips' memory less the resident state of the step
(`planned_free_bytes`).

Dimension key (docs/dimensions.md): B prompts of a call, G samples per prompt, R = B x G rows,
T max new tokens.
"""

import dataclasses

from jtc.models import decode_loop
from jtc.rl import sharding as sharding_lib

GIB = 2.0**30


@dataclasses.dataclass(frozen=True)
class Decoding:
  """One sampler call's decoding settings and why."""
  scheduler: str  # 'static' | 'continuous'
  rows: int  # R = B x G rows of the call (of each member)
  slots: int  # the decode slots the continuous scheduler runs (under 'static' too: what it would)
  slots_from: str  # where ``slots`` comes from
  layout: str  # 'fsdp' | 'tensor' (`sharding.decode_layout_choice`)
  layout_why: str
  free_bytes: int | None  # the devices' free memory, summed (None: not reported)

  @property
  def compiled_slots(self):
    """The sampler's ``slots`` argument: the slot count under 'continuous', else None."""
    return self.slots if self.scheduler == 'continuous' else None

  def describe(self) -> str:
    """One line for `jtc plan`."""
    run = (f'continuous, {self.slots} decode slots for {self.rows} rows a call'
           if self.scheduler == 'continuous' else
           f'static, all {self.rows} rows of a call until the last ends (continuous would '
           f'run {self.slots} decode slots)')
    return (f'sampler: {run}; slots {self.slots_from}; decode layout {self.layout} '
            f'({self.layout_why})')


def planned_free_bytes(chip_bytes: float, resident_per_chip: float, n_devices: int) -> int:
  """The free memory a planned run's sampler finds at its first call: each chip's memory less
  the step's resident state (parameters, optimiser state, copies), summed over the chips."""
  return int(n_devices * max(chip_bytes - resident_per_chip, 0.0))


def resolve(rollout, model_config, mesh, *, rows: int, max_new_tokens: int, block_size: int,
            free_bytes: int | None, members: int = 1) -> Decoding:
  """The `Decoding` of a call of ``rows`` rows of config section ``rollout`` (decode_slots,
  scheduler, decode_layout) for ``model_config`` on ``mesh``, with ``free_bytes`` free."""
  configured = rollout.get('decode_slots', None)
  if configured is not None:
    slots = min(int(configured), rows)
    slots_from = f'config.rollout.decode_slots={configured}'
  else:
    slots = decode_loop.default_slots(model_config, rows, max_new_tokens, block_size, free_bytes,
                                      members)
    row = decode_loop.row_bytes(model_config, max_new_tokens, block_size)
    slots_from = ('default: every row (the devices report no free memory)' if free_bytes is None
                  else f'default: the rows whose cache ({row / 2**20:.3g} MiB each'
                  f'{f" x {members} members" if members > 1 else ""}) fits in '
                  f'{decode_loop.SLOT_MEMORY_FRACTION:g} of the {free_bytes / GIB:.4g} GiB free')
  layout, why = sharding_lib.decode_layout_choice(rollout.get('decode_layout', 'auto'), mesh,
                                                  model_config, free_bytes)
  return Decoding(scheduler=rollout.get('scheduler', 'static'), rows=rows, slots=slots,
                  slots_from=slots_from, layout=layout, layout_why=why, free_bytes=free_bytes)
