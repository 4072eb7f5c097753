"""The trainer's own check before step 1: its stages compiled for its devices, each stage's
memory (`memory_analysis()` plus the state it does not take as an argument) against the
device's capacity, and the planner's `does not fit` error instead of an out-of-memory error
in the middle of a step.

Runs where the capacity is known: an accelerator's `memory_stats()['bytes_limit']`, or a
capacity stated in $JTC_DEVICE_MEMORY_BYTES (how the CPU tests exercise it). The stages are
compiled through the trainer's own jitted functions (its behaviour pass and update, the
sampler's module-level jit with the tokenizer's ids) on abstract arguments of the shapes and
shardings its steps pass, so the steps find them compiled: each stage compiles once
(tests/plan/test_preflight.py counts the compilations).
"""

import sys

import jax

from jtc.plan import hardware
from jtc.plan import planner
from jtc.plan import stages as stages_lib

STAGES = ('sample', 'behaviour', 'reference', 'update', 'eval')


def check(c, model_config, mesh, *, behaviour_fn=None, update_fn=None, tokenizer=None):
  """Raises `hardware.DoesNotFit` naming the first stage of config ``c`` (the trainer's model
  and mesh) that exceeds its devices' memory; a no-op where the capacity is unknown. The
  trainer passes its ``behaviour_fn``, ``update_fn`` and ``tokenizer``."""
  # This process's own device: another process's cannot report its memory.
  device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
  capacity = hardware.device_capacity(device)
  if capacity is None:
    return
  fns = {'behaviour': behaviour_fn, 'update': update_fn}
  ids = (tokenizer.eos_id, tokenizer.pad_id) if tokenizer is not None else (1, 0)
  _, stages = stages_lib.build(c, list(mesh.devices.flat), device.platform, model_config, fns={
      k: v for k, v in fns.items() if v is not None
  }, ids=ids)
  for stage in stages:
    if stage.name not in STAGES:
      continue
    _, compiled, seconds = planner.compile_stage(stage)
    need = hardware.peak_bytes(compiled.memory_analysis()) + stage.resident_other
    print(
        f'preflight: {stage.name} compiled in {seconds:.1f} s, {need / hardware.GIB:.2f} GiB of '
        f'{capacity / hardware.GIB:.2f} GiB per device', file=sys.stderr)
    if need > capacity:
      raise hardware.DoesNotFit(
          hardware.does_not_fit(
              stage.name, need, capacity, f'{device.device_kind}; plan a '
              'setting that fits with python -m jtc.plan --suggest'))
