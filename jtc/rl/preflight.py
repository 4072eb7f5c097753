"""The trainer's own check before step 1: its stages compiled for its devices, each stage's
memory (`memory_analysis()` plus the state it does not take as an argument) against the device's
capacity, and `does not fit` naming the stage instead of an out-of-memory error in the middle of
a step.

Runs where the capacity is known: an accelerator's `memory_stats()['bytes_limit']`, or a
capacity stated in $JTC_DEVICE_MEMORY_BYTES (how the CPU tests exercise it). The stages are the
step's own (`jtc.rl.step.Step.stages`: its behaviour pass, token weights and update, the
sampler's module-level jit with the tokenizer's ids) on abstract arguments of the shapes and
shardings its steps pass, so the steps find them compiled: each stage compiles once
(tests/rl/test_preflight.py counts the compilations).
"""

import os
import sys

import jax

GIB = 2**30
# Every stage the trainer runs, DelTA's coefficient pass included; not the prefill, which the
# sample stage's program contains.
STAGES = ('sample', 'behaviour', 'reference', 'delta', 'update', 'eval')


class DoesNotFit(ValueError):
  """A stage whose memory per chip exceeds the chip's capacity."""


def does_not_fit(stage: str, need: float, capacity: float, where: str) -> str:
  return (f'does not fit: stage {stage!r} needs {need / GIB:.2f} GiB per chip, capacity '
          f'{capacity / GIB:.2f} GiB ({where})')


def device_capacity(device) -> float | None:
  """The bytes a program may use on ``device``: $JTC_DEVICE_MEMORY_BYTES when set (tests; a
  stated capacity), else `memory_stats()['bytes_limit']`, else None (unknown: a CPU)."""
  stated = os.environ.get('JTC_DEVICE_MEMORY_BYTES')
  if stated:
    return float(stated)
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  return float(stats['bytes_limit']) if stats and 'bytes_limit' in stats else None


def peak_bytes(memory) -> float:
  """A compiled program's peak per device from `memory_analysis()`: arguments + outputs -
  aliased + temporaries + generated code."""
  return float(memory.argument_size_in_bytes + memory.output_size_in_bytes -
               memory.alias_size_in_bytes + memory.temp_size_in_bytes +
               memory.generated_code_size_in_bytes)


def check(step, stages=STAGES):
  """Raises `DoesNotFit` naming the first of ``stages`` of ``step`` (a `jtc.rl.step.Step` on
  the trainer's mesh) that exceeds its devices' memory; a no-op where the capacity is unknown."""
  # This process's own device: another process's cannot report its memory.
  device = next(d for d in step.mesh.devices.flat if d.process_index == jax.process_index())
  capacity = device_capacity(device)
  if capacity is None:
    return
  for stage in step.stages(device.platform):
    if stage.name not in stages:
      continue
    _, compiled, seconds = stage.compile()
    need = peak_bytes(compiled.memory_analysis()) + stage.resident_other
    print(
        f'preflight: {stage.name} compiled in {seconds:.1f} s, {need / GIB:.2f} GiB of '
        f'{capacity / GIB:.2f} GiB per device', file=sys.stderr)
    if need > capacity:
      raise DoesNotFit(
          does_not_fit(
              stage.name, need, capacity, f'{device.device_kind}; plan a setting that fits with '
              'python -m jtc.plan --suggest'))
