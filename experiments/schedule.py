"""Scheduling a sweep's runs: the run x seed specs (`RunSpec`, `make_specs`), checked before any
compute (`validate_spec`), then run (bounded parallelism) as seed populations or one process
each, skipping the summarised, reusing another sweep's identical runs and summarising each run
(`run_sweep`). The command line is `experiments/run.py`.
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shlex
import sys
import threading

from absl import flags
from ml_collections import config_flags

from experiments import common
from experiments import populations as populations_lib
from experiments import sweeps as sweeps_lib
from experiments.launch import Launch, launch_program
from experiments.summaries import find_same_run, is_finished, make_summary, read_metrics, reuse_summary, summary_path, write_json

# ---------------------------------------------------------------------------------------------
# Run specs and commands.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run x seed of a sweep, with every setting that goes on its command line."""
  sweep: str
  run: sweeps_lib.Run
  seed: int
  num_steps: int
  config_arg: str
  overrides: tuple  # ((key, value), ...): shared + run overrides + seed + num_steps

  @property
  def run_id(self):
    return f'{self.run.name}__s{self.seed}'

  @property
  def config_path(self):
    path = f'configs/{self.run.config}.py'
    return f'{path}:{self.config_arg}' if self.config_arg else path

  @property
  def key(self):
    """Hash of what determines the run's result (config, arg, overrides)."""
    blob = json.dumps([self.config_path, [[k, common.fmt_value(v)] for k, v in self.overrides]])
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def override_flags(spec):
  return [f'--config.{k}={common.fmt_value(v)}' for k, v in spec.overrides]


def trainer_command(spec, workdir):
  """The `python -m jtc.train` argv of `spec` (the default command factory)."""
  return [
      sys.executable, '-m', 'jtc.train', f'--config={spec.config_path}', f'--workdir={workdir}'
  ] + override_flags(spec)


def make_specs(sweep, seeds, first_seed=0):
  """The run x seed specs of seeds first_seed .. first_seed + seeds - 1."""
  specs = []
  for seed in range(first_seed, first_seed + seeds):  # seed-major: partial sweeps stay balanced
    for run in sweep.runs:
      overrides = (tuple(sweep.shared) + tuple(run.overrides) + (('seed', seed),
                                                                 ('num_steps', sweep.num_steps)))
      specs.append(
          RunSpec(sweep=sweep.name, run=run, seed=seed, num_steps=sweep.num_steps,
                  config_arg=sweep.config_arg, overrides=overrides))
  return specs


def validate_spec(spec):
  """Parses the run's config + overrides exactly as the trainer does; ValueError if invalid.

  Catches typos and non-overridable fields (e.g. a None default) before any compute.
  """
  argv = ['jtc.train', f'--config={spec.config_path}'] + override_flags(spec)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'config', flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  cwd = os.getcwd()
  try:
    os.chdir(common.ROOT)
    fv(argv)
    config = fv.config
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'run {spec.run.name!r} of sweep {spec.sweep!r}: invalid config '
                     f'{shlex.join(argv[1:])}: {type(e).__name__}: {e}') from e
  finally:
    os.chdir(cwd)
  for k, v in spec.overrides:
    got = config
    for part in k.split('.'):
      got = got[part]
    if common.fmt_value(got) != common.fmt_value(v) and not (isinstance(got, float) and got == v):
      raise ValueError(
          f'run {spec.run.name!r}: --config.{k}={common.fmt_value(v)} parsed as {got!r}')
  return config


# ---------------------------------------------------------------------------------------------
# Launching.
# ---------------------------------------------------------------------------------------------


def _say(*args):
  print(*args, flush=True)


def _existing(spec, *, results_dir, log, replace):
  """('skipped' | 'reused' | 'failed', detail) when ``spec`` needs no run, else None.

  A summary of the same run id with OTHER settings is never replaced without ``replace``: the
  spec fails with a message naming the file (a quick try-out must not overwrite a sweep).
  """
  spath = summary_path(results_dir, spec)
  if os.path.exists(spath):
    old = common.read_summary(spath)
    if old.get('key') == spec.key:
      return 'skipped', spath
    if not replace:
      return 'failed', (f'{spath} holds a run with other settings (num_steps '
                        f'{old.get("num_steps")}, key {old.get("key")}); it was kept. Write '
                        'elsewhere (--results-root) or pass --replace to re-run and replace it.')
    log(f'[{spec.run_id}] settings changed since its summary was written: re-running (--replace)')
  same = find_same_run(results_dir, spec)
  if same is not None:
    write_json(spath, reuse_summary(same, spec))
    return 'reused', f'from {same["sweep"]}'
  return None


def execute(spec, *, results_dir, workroot, make_command=trainer_command, log=_say, replace=False,
            launch=Launch()):
  """Runs (or resumes, skips, reuses) one spec as its own process:
  ('skipped'|'reused'|'ok'|'failed', detail)."""
  existing = _existing(spec, results_dir=results_dir, log=log, replace=replace)
  if existing is not None:
    return existing
  workdir = os.path.join(workroot, spec.sweep, f'{spec.run_id}__{spec.key}')
  command = make_command(spec, workdir) + launch.mesh_flags(1)
  failure, wall = launch_program(
      command, workdir, label=spec.run_id, results_dir=results_dir, log=log, launch=launch,
      finished=lambda: is_finished(read_metrics(workdir), spec.num_steps))
  if failure:
    return 'failed', failure
  write_json(summary_path(results_dir, spec),
             make_summary(spec, workdir, read_metrics(workdir), wall_time_s=wall, command=command))
  return 'ok', f'{wall:.0f}s'


def execute_program(program, *, results_dir, workroot, log=_say, launch=Launch()):
  """Runs (or resumes) one population and summarises each of its members as its spec's run:
  {run_id: (status, detail)}. A member's wall time is its share of the program's."""
  workdir = os.path.join(workroot, program.specs[0].sweep, program.name)
  command = program.command(workdir) + launch.mesh_flags(len(program.specs))
  dirs = {s.run_id: program.member_dir(workdir, s) for s in program.specs}
  num_steps = program.specs[0].num_steps
  failure, wall = launch_program(
      command, workdir, label=program.name, results_dir=results_dir, log=log, launch=launch,
      finished=lambda: all(is_finished(read_metrics(d), num_steps) for d in dirs.values()))
  if failure:
    return {s.run_id: ('failed', failure) for s in program.specs}
  share = wall / len(program.specs)
  for spec in program.specs:
    summary = make_summary(spec, dirs[spec.run_id], read_metrics(dirs[spec.run_id]),
                           wall_time_s=share, command=command)
    summary.update(engine='population', population_workdir=workdir)
    write_json(summary_path(results_dir, spec), summary)
  return {s.run_id: ('ok', f'{wall:.0f}s for {len(program.specs)} members') for s in program.specs}


def run_sweep(sweep, *, seeds, jobs, results_dir, workroot, first_seed=0, make_command=None,
              validate=True, log=_say, replace=False, launch=Launch()):
  """Runs every spec (bounded parallelism: ``jobs`` processes at once); returns {run_id: (status,
  detail)}. Specs that still need a run go as seed populations (`experiments.populations`), or
  each as its own process with ``make_command(spec, workdir)`` (`trainer_command`:
  --no-population)."""
  specs = make_specs(sweep, seeds, first_seed)
  total, results, invalid = len(specs), {}, {}
  if validate:
    for spec in specs[:len(sweep.runs)]:  # the configs differ by run, not by seed
      try:
        validate_spec(spec)
      except ValueError as e:
        invalid[spec.run.name] = str(e)
        log(f'[{spec.run.name}] INVALID, not launched: {e}')
  lock = threading.Lock()

  def report(run_id, status, detail):
    with lock:
      results[run_id] = (status, detail)
      log(f'[{run_id}] {status} ({len(results)}/{total})' +
          (f'\n{detail}' if status == 'failed' else ''))

  def locked_log(*args):  # one line at a time from parallel runs
    with lock:
      log(*args)

  def guarded(fn, item, run_ids):
    try:
      return fn(item)
    except Exception as e:  # pylint: disable=broad-except
      return {r: ('failed', f'{type(e).__name__}: {e}') for r in run_ids}

  needed = []
  for spec in specs:
    existing = (('failed', invalid[spec.run.name]) if spec.run.name in invalid else _existing(
        spec, results_dir=results_dir, log=locked_log, replace=replace))
    if existing is None:
      needed.append(spec)
    else:
      report(spec.run_id, *existing)
  if make_command is not None:
    work = [(s, [s.run_id]) for s in needed]
    fn = lambda s: {
        s.run_id:
            execute(s, results_dir=results_dir, workroot=workroot, make_command=make_command, log=
                    locked_log, replace=replace, launch=launch)
    }
  else:
    work = [(p, [s.run_id for s in p.specs]) for p in populations_lib.programs(needed)]
    fn = lambda p: execute_program(p, results_dir=results_dir, workroot=workroot, log=locked_log,
                                   launch=launch)

  def one(item_ids):
    for run_id, (status, detail) in guarded(fn, *item_ids).items():
      report(run_id, status, detail)

  with concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
    list(pool.map(one, work))
  return results
