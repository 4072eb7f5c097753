r"""`jtc plan` / `python -m jtc.plan`: compile one RL step of a config for a TPU slice without the hardware.

  python -m jtc.plan --config configs/real/qwen3_8b_math_dapo.py --topology v5e-64
  python -m jtc.plan --config configs/real/qwen3_8b_math_dapo.py --topology v5e:2x2 \
      --config.mesh.data=-1 --config.mesh.fsdp=1            # exits 1: does not fit
  python -m jtc.plan --config ... --topology v5e:2x2 --suggest  # a setting that fits
  python -m jtc.plan --config ... --gpu h100 --gpus 8       # estimate, not compiled for the GPU

Needs libtpu (`pip install -e ".[plan]"`) for TPU targets. JAX cannot compile for CUDA without a
GPU: `--gpu` compiles for the host CPU with as many devices and reads FLOPs and bytes from that
program with the GPU's roofline constants; its HBM check is analytic (the state's bytes per
device from the shardings + XLA:CPU's temporaries), labelled so.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from jtc.cli import absl_program
from jtc.cli import train as train_cli
from jtc.plan import hardware


def host_devices_for_gpus(argv):
  """--gpu with --gpus N, set before JAX's backend starts: N host devices stand in for the GPUs
  (the planner's host backend is the CPU; targets are explicit)."""
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  if any(a.startswith('--gpu') for a in argv):
    n = gpus_flag(argv)
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               f' --xla_force_host_platform_device_count={int(n)}')


def gpus_flag(argv) -> str:
  """The value of --gpus in ``argv`` (``--gpus=N`` or ``--gpus N``; the last one wins, as absl
  parses it), '8' (its default) without one."""
  n = '8'
  for i, a in enumerate(argv):
    if a.startswith('--gpus='):
      n = a.split('=', 1)[1]
    elif a == '--gpus' and i + 1 < len(argv):
      n = argv[i + 1]
  return n


def define_flags(flag_values, argv=None):
  """The command's flags on ``flag_values``; returns their names."""
  config_flags.DEFINE_config_file(
      'config', None, 'An RL config (configs/*.py, configs/real/*.py); '
      'override keys with --config.<section>.<key>=value.', lock_config=True,
      flag_values=flag_values, sys_argv=argv)
  flags.DEFINE_string(
      'topology', None, f'TPU topology or slice: {", ".join(hardware.SLICES)}, '
      'or a topology such as v5e:2x2.', flag_values=flag_values)
  flags.DEFINE_integer('num_slices', 1, 'Slices joined over the data-centre network.',
                       flag_values=flag_values)
  flags.DEFINE_enum('gpu', None, [k for k, v in hardware.CHIPS.items() if v.platform == 'gpu'],
                    'Estimate for GPUs instead (not compiled for the GPU).',
                    flag_values=flag_values)
  flags.DEFINE_integer('gpus', 8, 'With --gpu: the number of GPUs.', flag_values=flag_values)
  flags.DEFINE_bool(
      'suggest', False, 'Search mesh / micro-batches / sampler and scoring chunks / remat for '
      'the cheapest setting that fits (exit 0 when one is found).', flag_values=flag_values)
  flags.DEFINE_list('stages', [], 'Only these stages (default: all).', flag_values=flag_values)
  flags.DEFINE_string(
      'lengths', None, 'Length-aware sampler estimates (static and continuous): MEAN,P99 of the '
      "answers' lengths in tokens, or a previous run's workdir (its response_length metrics).",
      flag_values=flag_values)
  return ['config', 'topology', 'num_slices', 'gpu', 'gpus', 'suggest', 'stages', 'lengths']


def target(gpu, gpus, topology, num_slices):
  """(devices, platform, chip, target name, what compiles) for the command line's target."""
  import jax  # pylint: disable=import-outside-toplevel
  if gpu:
    devices = jax.devices('cpu')
    if len(devices) != gpus:
      raise ValueError(f'--gpus={gpus}: {len(devices)} host devices (set before jax starts)')
    return (devices, 'gpu', hardware.CHIPS[gpu], f'{gpus} x {gpu}',
            'estimate, not compiled for the GPU: FLOPs and bytes of the XLA:CPU program, HBM '
            'check analytic (state bytes + XLA:CPU temporaries)')
  if not topology:
    raise ValueError('--topology (or --gpu) is required; known topologies: '
                     f'{", ".join(hardware.SLICES)}')
  name = hardware.topology_name(topology)
  devices = hardware.topology_devices(name, num_slices)
  where = f'{topology} ({name})' + (f' x {num_slices} slices' if num_slices > 1 else '')
  return devices, 'tpu', hardware.chip_of(name), where, 'compiled for the TPU by libtpu'


def run(argv):
  """Plans ``FLAGS.config`` for the command line's target; prints the table and exits 1 (with the
  reason) when a stage does not fit."""
  from jtc.plan import lengths as lengths_lib  # pylint: disable=import-outside-toplevel
  from jtc.plan import planner  # pylint: disable=import-outside-toplevel
  from jtc.plan import suggest as suggest_lib  # pylint: disable=import-outside-toplevel
  from jtc.plan import table  # pylint: disable=import-outside-toplevel
  from jtc.rl import population as population_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import update as update_lib  # pylint: disable=import-outside-toplevel
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.ERROR)
  FLAGS = flags.FLAGS
  c = FLAGS.config
  log = lambda m: print(m, file=sys.stderr, flush=True)
  try:
    planner.check_stages(FLAGS.stages)
    lengths = FLAGS.lengths and lengths_lib.parse(FLAGS.lengths, c.rollout.sampling.max_new_tokens)
    population_lib.check_config(c)
    rollout_lib.check_config(c)
    update_lib.check_config(c.optim, c.rollout.prompts_per_step)
    devices, platform, chip, where, compiled_for = target(FLAGS.gpu, FLAGS.gpus, FLAGS.topology,
                                                          FLAGS.num_slices)
    plan_fn = lambda cfg, **kw: planner.plan(cfg, devices, platform=platform, chip=chip, target=
                                             where, compiled_for=compiled_for, only=FLAGS.stages,
                                             log=log, **kw)
    absent = [n for n in FLAGS.stages if n not in planner.stage_names(c, devices, platform)]
    if absent:  # a stage this config's step does not run (e.g. delta without DelTA)
      raise ValueError(f'--stages: this config runs no {", ".join(map(repr, absent))} stage; its '
                       f'stages: {", ".join(planner.stage_names(c, devices, platform))}')
    try:
      check_mesh(c, len(devices))
    except ValueError as e:  # --suggest searches the mesh: a configured one that cannot run here
      if not FLAGS.suggest:  # is no reason to stop it
        raise
      log(f'suggest: the configured setting cannot run on {where} ({e}); searching')
      result = None
    else:
      result = plan_fn(c, stop_early=FLAGS.suggest)  # --suggest needs the verdict only
  except ValueError as e:
    sys.exit(f'error: {e}')
  if not FLAGS.suggest:
    if result.failure:  # the refusal, not a table of the stages it did not reach
      sys.exit(table.refusal(result))
    print(table.format_table(result))
    for line in lengths_lib.plan_lines(result, lengths) if lengths else ():
      print(line)
    if result.verdict():
      sys.exit(result.verdict())
    return
  # --suggest exits 0 with a setting that fits, whether or not the config does.
  if result is not None:
    print(
        table.format_table(result) if result.
        fits else f'as configured: {table.refusal(result) if result.failure else result.verdict()}')
  model_config = planner.model_config_for(c, platform)
  overrides, best = suggest_lib.suggest(c, plan_fn, len(devices), model_config, chip, log=log)
  if overrides is None:
    sys.exit('suggest: no candidate setting fits; try a larger slice')
  print(table.format_table(best))
  print(f'suggest: the cheapest fitting setting found ({best.step_seconds:.4g} s per step, '
        f'roofline of its compiled stages; peak {best.worst.peak / hardware.GIB:.2f} GiB per '
        f'chip):\n  {suggest_lib.flags(overrides)}')


def check_mesh(c, n_devices):
  """The mesh against the chips, and the batches against the mesh: errors naming both."""
  from jtc.rl import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import update as update_lib  # pylint: disable=import-outside-toplevel
  sizes = sharding_lib.mesh_sizes(**c.mesh, n_devices=n_devices)
  sharding_lib.check_batch_rows(
      update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples, sizes)


def main(argv=None, prog='python -m jtc.plan'):
  """The command: ``argv`` without the program name (None: the process's)."""
  host_devices_for_gpus(sys.argv[1:] if argv is None else argv)
  absl_program.run(run, argv, prog=prog, define_flags=define_flags,
                   flags_parser=train_cli.parse_flags)
