r"""Runs a sweep of `experiments/sweeps.py` (configs x seeds) and writes its results file.

  python -m experiments.run <sweep> [--seeds N] [--first-seed K] [--jobs J] [--smoke]
                            [--workroot DIR] [--num-steps S [--canonical]] [--replace]
                            [--tables-only [--refresh-curves]] [--runs NAME,...]
                            [--no-population]
                            [--processes N [--launcher 'srun ...']]

The command line lives here; scheduling the runs in `experiments/schedule.py`, the tables,
statistics and figures of the results file in `experiments/report.py`.

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
import dataclasses
import os
import shlex
import sys
import time

from experiments import common
from experiments import credit_probe
from experiments import report
from experiments import schedule
from experiments import sweeps as sweeps_lib
from experiments.launch import Launch
from experiments.summaries import compress, refresh_curves, write_json
from jtc import files

RESULTS_DIR = common.results_dir()
DEFAULT_WORKROOT = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'jtc_experiments')


def _parser(results_root, prog='python -m experiments.run'):
  parser = argparse.ArgumentParser(
      prog=prog, description=__doc__.split('\n\n')[0],
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
      '--compress', action='store_true',
      help='with --tables-only: first rewrite each plain runs/<run id>.json summary as '
      '<run id>.json.gz (the format runs write since jtc 0.2), removing the plain file once '
      'its compressed copy reads back equal')
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


REBUILT_LINE = '- Tables rebuilt from the per-run summaries by '


def _tables(text):
  """A results file's text without the line saying which command rebuilt it and when."""
  return [line for line in text.splitlines() if not line.startswith(REBUILT_LINE)]


def _read(path):
  if not os.path.exists(path):
    return None
  with open(path, 'rb') as f:
    return f.read()


def rebuild_tables(sweep, *, results_dir, md_path, write):
  """``--tables-only``: the results file rebuilt from the summaries, written only when its tables
  change (a rebuild that changes nothing leaves the file and its curves untouched, so a checkout
  stays clean). ``write(md_path)`` writes the file (`report.write_results`). Returns whether
  the file changed."""
  png = os.path.join(results_dir, 'curves.png')
  before = {path: _read(path) for path in (md_path, png)}
  write(md_path)
  if before[md_path] is None or _tables(before[md_path].decode()) != _tables(
      _read(md_path).decode()):
    return True
  for path, data in before.items():  # the same tables: every file as it was
    if data is None:
      os.remove(path)
    else:
      with open(path, 'wb') as f:
        f.write(data)
  return False


def main(argv=None, *, make_command=None, results_root=RESULTS_DIR,
         prog='python -m experiments.run'):
  parser = _parser(results_root, prog)
  args = parser.parse_args(argv)
  if args.sweep not in sweeps_lib.SWEEPS:
    parser.error(f'unknown sweep {args.sweep!r}; valid: {sorted(sweeps_lib.SWEEPS)}')
  if args.processes < 1 or (args.launcher and args.processes == 1):
    parser.error(f'--processes {args.processes} --launcher {args.launcher!r}: --processes must be '
                 '>= 1, and a --launcher needs --processes N, the number of processes it starts')
  if (args.refresh_curves or args.compress) and not args.tables_only:
    parser.error('--refresh-curves and --compress rewrite finished summaries; they need '
                 '--tables-only')
  launch = Launch(processes=args.processes, prefix=tuple(shlex.split(args.launcher)))
  sweep = sweeps_lib.get_sweep(args.sweep, smoke=args.smoke, num_steps=args.num_steps)
  if sweep.blocked and not args.tables_only:
    parser.error(sweep.blocked)
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
  results_dir, md_path = report.result_paths(sweep.name, smoke=args.smoke, scratch=resized and
                                             not args.canonical, results_root=args.results_root)
  if args.tables_only and not common.summary_files(results_dir):  # nothing is written
    parser.error(f'no run summaries in {os.path.join(results_dir, "runs")}: nothing to tabulate '
                 '(run the sweep first, or name the folder that holds its results with '
                 '--results-root)')
  os.makedirs(results_dir, exist_ok=True)
  command = 'python -m experiments.run ' + shlex.join(sys.argv[1:] if argv is None else argv)
  t0 = time.time()
  invocation_path = os.path.join(results_dir, 'invocation.json')
  if args.tables_only:
    if args.compress:
      print(f'compressed {compress(results_dir)} summaries')
    if args.refresh_curves:
      try:
        print(f'refreshed the curves of {refresh_curves(results_dir)} summaries')
      except ValueError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    failures = common.failures_on_disk(results_dir)
  else:
    est = sweeps_lib.estimate_seconds(part, seeds=seeds)
    print(
        f'{sweep.name}: {len(part.runs)} configs x {seeds} seeds, {sweep.num_steps} steps; '
        f'estimated {est / 60:.0f} min of machine time; results in {md_path}', flush=True)
    if args.no_population and make_command is None:
      make_command = schedule.trainer_command
    first_seed = sweep.first_seed if args.first_seed is None else args.first_seed
    if sweep.engine == 'probe':  # measured in this process, no trainer (credit_probe.py)
      results = credit_probe.run_probe(part, seeds=seeds, first_seed=first_seed,
                                       results_dir=results_dir, replace=args.replace)
    else:
      results = schedule.run_sweep(part, seeds=seeds, first_seed=first_seed, jobs=args.jobs,
                                   results_dir=results_dir, workroot=args.workroot,
                                   make_command=make_command, replace=args.replace, launch=launch)
    failures = {k: d for k, (s, d) in results.items() if s == 'failed'}
    if all(status == 'skipped' for status, _ in results.values()) and os.path.exists(md_path):
      print(f'nothing new: every run was already summarised; {md_path} left as it is')
      return 0
  # Read when the runs are over, so a part that finished meanwhile (another invocation of the
  # same sweep, e.g. with --runs) is kept.
  parts = report.read_parts(invocation_path)  # the invocations that ran the sweep, a part each
  if not args.tables_only:
    parts.append({
        'command': command,
        'wall_time_s': time.time() - t0,
        'revision': common.code_revision(),
        'platform': common.platform()
    })
    write_json(invocation_path, {'parts': parts})

  def write(path):
    return report.write_results(sweep, results_dir=results_dir, md_path=path,
                                command='; '.join(p['command'] for p in parts) or command,
                                wall_time_s=sum(p['wall_time_s'] for p in parts),
                                revision=parts[-1]['revision'] if parts else None,
                                failures=failures, rebuilt_by=command if args.tables_only else None)

  if args.tables_only:
    if not rebuild_tables(sweep, results_dir=results_dir, md_path=md_path, write=write):
      print(f'{md_path} is up to date: the summaries give the tables it holds (left as it is)')
      return 1 if failures else 0
    path = md_path
  else:
    path = write(md_path)
  print(f'wrote {path}' +
        (f'; {len(failures)} run(s) FAILED: {sorted(failures)}' if failures else ''))
  return 1 if failures else 0


if __name__ == '__main__':
  with files.report_damage():
    sys.exit(main())
