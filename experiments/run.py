r"""Runs a sweep of `experiments/sweeps.py` (configs x seeds) and writes its results file.

  python -m experiments.run <sweep> [--seeds N] [--first-seed K] [--jobs J] [--smoke]
                            [--workroot DIR] [--num-steps S [--canonical]] [--replace]
                            [--tables-only [--refresh-curves]] [--runs NAME,...]
                            [--no-population]
                            [--processes N [--launcher 'srun ...']]

Running lives here; the tables, statistics and figures of the results file in
`experiments/report.py`.

* Runs that differ only in seed or in a hyper-parameter a population can vary (the learning
  rate, ...) are trained together as one seed population, one `python -m jtc.train` program
  (`experiments/populations.py`); `--no-population` runs every run x seed as its own process
  instead. At most `--jobs` programs run at a time (default: the number of cores). Workdirs go
  to `<workroot>/<sweep>/`, named by a hash of their settings (a re-sized sweep never resumes a
  different run). Either way each run x seed gets the same per-run summary.
* `--processes N`: each program runs as N processes joined by `jax.distributed` (its members,
  or for a single run its batch, sharded over them), started on this host, or by a cluster
  launcher given as `--launcher` (e.g. `srun -N 2 --ntasks-per-node=1`) with the workroot on a
  filesystem every node sees.
* Seeds K..K+N-1 (`--first-seed K --seeds N`): confirmatory runs use seeds that no run used to
  choose a setting (experiments/claims.py).
* Runs are identified by their settings: a run with exactly the settings (and seed) of a run
  already summarised by another sweep (e.g. table2's GSPO and DFPO rows = table1's) is copied
  from there, not re-run, and the results file says so.
* Resumable: a run whose summary `experiments/results/<sweep>/runs/<run>__s<seed>.json` exists
  (with the same settings) is skipped; a workdir without a summary is resumed by the trainer
  from its last checkpoint.
* The summary JSON (final metrics, curves, compute counters, wall time, overrides, command) is
  all the tables need: `--tables-only` rebuilds `experiments/results/<sweep>.md` and the plots
  in `experiments/results/<sweep>/` from the summaries alone, on any machine; with
  `--refresh-curves` it first re-reads the summaries' curves from the runs' metrics.jsonl (on
  the machine that has the workdirs), for a table whose curve the summaries did not yet keep.
* Nothing committed is overwritten by accident: `--smoke` writes under
  `experiments/results/smoke/`, a resized sweep (`--num-steps` other than the sweep's) under
  `experiments/results/scratch/` (unless `--canonical`), a per-run summary written with other
  settings is kept and the run refused (unless `--replace`), and an invocation that ran nothing
  new leaves the results file as it was.
* A sweep too long for one sitting runs in parts: `--runs` names the runs of this part (all
  seeds); `invocation.json` lists every part's command, wall time and revision, and the results
  file shows the tables of whatever has been run so far.
* A failed run is reported with the tail of its stderr; the others continue; the exit status
  is 1 if any run failed.
* Text in `experiments/results/<sweep>.notes.md` (hand-written discussion) is copied into the
  results file under "Discussion", so regenerating the tables keeps it.
"""

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shlex
import sys
import threading
import time

from experiments import populations as populations_lib
from experiments.launch import Launch, launch_program
from experiments import report
from experiments import sweeps as sweeps_lib
from jtc import files
from experiments.summaries import _write_json, find_same_run, is_finished, make_summary, read_metrics, refresh_curves, reuse_summary, summary_path  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, 'experiments', 'results')
DEFAULT_WORKROOT = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'jtc_experiments')

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
    blob = json.dumps([self.config_path, [[k, _fmt(v)] for k, v in self.overrides]])
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


_fmt = report.fmt_value


def override_flags(spec):
  return [f'--config.{k}={_fmt(v)}' for k, v in spec.overrides]


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
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  argv = ['jtc.train', f'--config={spec.config_path}'] + override_flags(spec)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'config', flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  cwd = os.getcwd()
  try:
    os.chdir(ROOT)
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
    if _fmt(got) != _fmt(v) and not (isinstance(got, float) and got == v):
      raise ValueError(f'run {spec.run.name!r}: --config.{k}={_fmt(v)} parsed as {got!r}')
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
    old = report.read_summary(spath)
    if old.get('key') == spec.key:
      return 'skipped', spath
    if not replace:
      return 'failed', (f'{spath} holds a run with other settings (num_steps '
                        f'{old.get("num_steps")}, key {old.get("key")}); it was kept. Write '
                        'elsewhere (--results-root) or pass --replace to re-run and replace it.')
    log(f'[{spec.run_id}] settings changed since its summary was written: re-running (--replace)')
  same = find_same_run(results_dir, spec)
  if same is not None:
    _write_json(spath, reuse_summary(same, spec))
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
  _write_json(summary_path(results_dir, spec),
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
    _write_json(summary_path(results_dir, spec), summary)
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


def result_paths(sweep_name, *, smoke, scratch=False, results_root=RESULTS_DIR):
  """(results_dir, md_path): <root>/<sweep>/ and <root>/<sweep>.md, under smoke/ or scratch/
  for the small and the resized forms of a sweep (never the committed results)."""
  root = results_root
  if smoke:
    root = os.path.join(results_root, 'smoke')
  elif scratch:
    root = os.path.join(results_root, 'scratch')
  return os.path.join(root, sweep_name), os.path.join(root, f'{sweep_name}.md')


def _read_parts(invocation_path):
  if not os.path.exists(invocation_path):
    return []
  return invocation_parts(files.read_json(invocation_path, expected='a sweep\'s invocation record'))


def invocation_parts(invocation):
  """The parts of a sweep's invocation.json: [{command, wall_time_s, revision}, ...]. A file
  written before sweeps could run in parts holds one invocation, not a list."""
  return invocation.get('parts', [invocation])


def _parser(results_root):
  parser = argparse.ArgumentParser(
      prog='python -m experiments.run', description=__doc__.split('\n\n')[0],
      epilog='Results go to experiments/results/<sweep>.md (tables, discussion) and '
      'experiments/results/<sweep>/ (per-run summaries runs/*.json, curves.png, '
      'invocation.json); --smoke and resized sweeps (--num-steps) go under '
      'experiments/results/smoke/ and experiments/results/scratch/ instead. Trainer '
      'workdirs go to --workroot.')
  parser.add_argument('sweep', help=f'one of {sorted(sweeps_lib.SWEEPS)}')
  parser.add_argument('--seeds', type=int, default=None,
                      help="N seeds per config (default: the sweep's own)")
  parser.add_argument(
      '--first-seed', type=int, default=None,
      help="seeds K..K+N-1 (default: the sweep's own, 8 for a confirmatory sweep: "
      'seeds that no run used to choose a setting)')
  parser.add_argument(
      '--no-population', action='store_true',
      help='one trainer process per run x seed instead of one population per '
      'group of runs that differ only in seed or a varied hyper-parameter')
  parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1,
                      help='trainer processes at once (default: the number of cores)')
  parser.add_argument('--smoke', action='store_true',
                      help='the seconds-long form of the sweep (results under smoke/)')
  parser.add_argument('--workroot', default=DEFAULT_WORKROOT,
                      help=f'where trainer workdirs go (default {DEFAULT_WORKROOT})')
  parser.add_argument(
      '--num-steps', type=int, default=None,
      help="replaces the sweep's num_steps knob; unless it equals the sweep's "
      'own, results go under scratch/ (see --canonical)')
  parser.add_argument('--canonical', action='store_true',
                      help='write a resized sweep to the committed results anyway')
  parser.add_argument(
      '--replace', action='store_true',
      help='re-run and replace per-run summaries written with other settings '
      '(refused otherwise)')
  parser.add_argument('--results-root', default=results_root,
                      help=f'root of the results files (default {results_root})')
  parser.add_argument('--tables-only', action='store_true',
                      help='rebuild the results file from the run summaries; run nothing')
  parser.add_argument(
      '--refresh-curves', action='store_true',
      help="with --tables-only: first re-read every summary's curves from its run's "
      'metrics.jsonl (all or nothing)')
  parser.add_argument(
      '--runs', default=None,
      help='comma-separated run names: run only this part of the sweep (the tables still '
      'cover the whole sweep; a later invocation runs the rest)')
  parser.add_argument(
      '--processes', type=int, default=1,
      help='each program as N processes joined by jax.distributed, its members (or batch) '
      'sharded over them; started on this host unless --launcher')
  parser.add_argument(
      '--launcher', default='',
      help="a cluster launcher that starts a program's --processes, prefixed to the trainer "
      "command (e.g. 'srun -N 2 --ntasks-per-node=1'); the workroot must be on a shared "
      'filesystem')
  return parser


def main(argv=None, *, make_command=None, results_root=RESULTS_DIR):
  parser = _parser(results_root)
  args = parser.parse_args(argv)
  if args.sweep not in sweeps_lib.SWEEPS:
    parser.error(f'unknown sweep {args.sweep!r}; valid: {sorted(sweeps_lib.SWEEPS)}')
  if args.processes < 1 or (args.launcher and args.processes == 1):
    parser.error(f'--processes {args.processes} --launcher {args.launcher!r}: --processes must be '
                 '>= 1, and a --launcher needs --processes N, the number of processes it starts')
  if args.refresh_curves and not args.tables_only:
    parser.error('--refresh-curves rebuilds finished summaries; it needs --tables-only')
  launch = Launch(processes=args.processes, prefix=tuple(shlex.split(args.launcher)))
  sweep = sweeps_lib.get_sweep(args.sweep, smoke=args.smoke, num_steps=args.num_steps)
  resized = sweep.num_steps != sweeps_lib.get_sweep(args.sweep, smoke=args.smoke).num_steps
  seeds = args.seeds or sweep.seeds
  part = sweep
  if args.runs is not None:
    names = [n for n in args.runs.split(',') if n]
    valid = [r.name for r in sweep.runs]
    bad = [n for n in names if n not in valid]
    if bad or not names:
      parser.error(f'--runs {args.runs!r}: unknown run(s) {bad}; valid: {valid}')
    part = dataclasses.replace(sweep, runs=tuple(r for r in sweep.runs if r.name in names))
  results_dir, md_path = result_paths(sweep.name, smoke=args.smoke, scratch=resized and
                                      not args.canonical, results_root=args.results_root)
  os.makedirs(results_dir, exist_ok=True)
  command = 'python -m experiments.run ' + shlex.join(sys.argv[1:] if argv is None else argv)
  t0 = time.time()
  invocation_path = os.path.join(results_dir, 'invocation.json')
  if args.tables_only:
    if args.refresh_curves:
      try:
        print(f'refreshed the curves of {refresh_curves(results_dir)} summaries')
      except ValueError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    failures = report.failures_on_disk(results_dir)
  else:
    est = sweeps_lib.estimate_seconds(part, seeds=seeds)
    print(
        f'{sweep.name}: {len(part.runs)} configs x {seeds} seeds, {sweep.num_steps} steps; '
        f'estimated {est / 60:.0f} min of machine time; results in {md_path}', flush=True)
    if args.no_population and make_command is None:
      make_command = trainer_command
    first_seed = sweep.first_seed if args.first_seed is None else args.first_seed
    results = run_sweep(part, seeds=seeds, first_seed=first_seed, jobs=args.jobs,
                        results_dir=results_dir, workroot=args.workroot, make_command=make_command,
                        replace=args.replace, launch=launch)
    failures = {k: d for k, (s, d) in results.items() if s == 'failed'}
    if all(status == 'skipped' for status, _ in results.values()) and os.path.exists(md_path):
      print(f'nothing new: every run was already summarised; {md_path} left as it is')
      return 0
  # Read when the runs are over, so a part that finished meanwhile (another invocation of the
  # same sweep, e.g. with --runs) is kept.
  parts = _read_parts(invocation_path)  # the invocations that ran the sweep, a part each
  if not args.tables_only:
    parts.append({
        'command': command,
        'wall_time_s': time.time() - t0,
        'revision': report.code_revision()
    })
    _write_json(invocation_path, {'parts': parts})
  path = report.write_results(sweep, results_dir=results_dir, md_path=md_path,
                              command='; '.join(p['command'] for p in parts) or command,
                              wall_time_s=sum(p['wall_time_s'] for p in parts),
                              revision=parts[-1]['revision'] if parts else None, failures=failures,
                              rebuilt_by=command if args.tables_only else None)
  print(f'wrote {path}' +
        (f'; {len(failures)} run(s) FAILED: {sorted(failures)}' if failures else ''))
  return 1 if failures else 0


if __name__ == '__main__':
  with files.report_damage():
    sys.exit(main())
