r"""Runs a sweep of `experiments/sweeps.py` (configs x seeds) and writes its results file.

  python -m experiments.run <sweep> [--seeds N] [--jobs J] [--smoke] [--workroot DIR]
                            [--num-steps S] [--tables-only]

* Every run x seed is one `python -m jtc.train` subprocess, at most `--jobs` at a time
  (default: the number of cores). Its workdir is `<workroot>/<sweep>/<run>__s<seed>__<hash>`
  (hash of the command's settings, so a re-sized sweep never resumes a different run).
* Runs are identified by their settings: a run with exactly the settings (and seed) of a run
  already summarised by another sweep (e.g. table2's GSPO and DFPO rows = table1's) is copied
  from there, not re-run, and the results file says so.
* Resumable: a run whose summary `experiments/results/<sweep>/runs/<run>__s<seed>.json` exists
  (with the same settings) is skipped; a workdir without a summary is resumed by the trainer
  from its last checkpoint.
* The summary JSON (final metrics, curves, compute counters, wall time, overrides, command) is
  all the tables need: `--tables-only` rebuilds `experiments/results/<sweep>.md` and the plots
  in `experiments/results/<sweep>/` from the summaries alone, on any machine.
* `--smoke` runs the small form of the sweep and writes under `experiments/results/smoke/`, so
  it never touches real results.
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
import subprocess
import sys
import threading
import time

import numpy as np

from experiments import stats
from experiments import sweeps as sweeps_lib
from jtc import curves
from jtc import metric_writer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, 'experiments', 'results')
DEFAULT_WORKROOT = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'jtc_experiments')
MAX_CURVE_POINTS = 1000
STDERR_TAIL_LINES = 25
SMOOTH_STEPS = 5                  # trailing mean of the reward before compute_at_threshold
CURVE_KEYS = ('reward_mean', 'reward_std', 'accuracy', 'entropy', 'asym', 'format/entropy',
              'response_length', 'approx_kl', 'clip_frac_high', 'clip_frac_low', 'asym_gated',
              'coef_mass_vs_gspo', 'frac_traj_gated',
              'compute/generated_tokens', 'compute/update_steps', 'compute/rollouts',
              'compute/prompts', 'time_sample', 'time_update')
CURVE_PATTERNS = ('eval/', 'energy', 'diag/', 'delta/')


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
  overrides: tuple        # ((key, value), ...): shared + run overrides + seed + num_steps

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


def _fmt(value):
  return repr(value) if isinstance(value, float) else str(value)


def override_flags(spec):
  return [f'--config.{k}={_fmt(v)}' for k, v in spec.overrides]


def trainer_command(spec, workdir):
  """The `python -m jtc.train` argv of `spec` (the default command factory)."""
  return [sys.executable, '-m', 'jtc.train', f'--config={spec.config_path}',
          f'--workdir={workdir}'] + override_flags(spec)


def make_specs(sweep, seeds):
  specs = []
  for seed in range(seeds):                       # seed-major: partial sweeps stay balanced
    for run in sweep.runs:
      overrides = (tuple(sweep.shared) + tuple(run.overrides)
                   + (('seed', seed), ('num_steps', sweep.num_steps)))
      specs.append(RunSpec(sweep=sweep.name, run=run, seed=seed, num_steps=sweep.num_steps,
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
# Per-run summaries.
# ---------------------------------------------------------------------------------------------

def read_metrics(workdir):
  """Records of `<workdir>/metrics.jsonl` (a torn last line is ignored)."""
  return metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))


def _is_number(v):
  return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _keep_curve(key):
  return key in CURVE_KEYS or any(p in key for p in CURVE_PATTERNS)


def extract_curves(records, *, max_points=MAX_CURVE_POINTS):
  """{key: {'step': [...], 'value': [...]}} for the tracked keys, at most `max_points` each."""
  curves = {}
  for r in records:
    for k, v in r.items():
      if k != 'step' and _keep_curve(k) and _is_number(v):
        c = curves.setdefault(k, {'step': [], 'value': []})
        c['step'].append(r['step'])
        c['value'].append(v)
  for c in curves.values():
    n = len(c['step'])
    if n > max_points:
      idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
      c['step'] = [c['step'][i] for i in idx]
      c['value'] = [c['value'][i] for i in idx]
      c['subsampled_from'] = n
  return curves


def is_finished(records, num_steps):
  return any(r.get('step') == num_steps for r in records)


def make_summary(spec, workdir, records, *, wall_time_s, command):
  final = next((r for r in reversed(records) if r.get('step') == spec.num_steps), records[-1])
  return {
      'sweep': spec.sweep, 'run': spec.run.name, 'label': spec.run.label,
      'group': spec.run.group, 'config': spec.run.config, 'config_arg': spec.config_arg,
      'seed': spec.seed, 'num_steps': spec.num_steps, 'key': spec.key,
      'overrides': {k: v for k, v in spec.overrides}, 'command': shlex.join(command),
      'workdir': workdir, 'wall_time_s': wall_time_s,
      'final': {k: v for k, v in final.items() if _is_number(v)},
      'compute': {k: v for k, v in final.items() if k.startswith('compute/')},
      'curves': extract_curves(records),
  }


def summary_path(results_dir, spec):
  return os.path.join(results_dir, 'runs', f'{spec.run_id}.json')


def load_summaries(results_dir):
  runs_dir = os.path.join(results_dir, 'runs')
  out = []
  if not os.path.isdir(runs_dir):
    return out
  for fname in sorted(os.listdir(runs_dir)):
    if fname.endswith('.json'):
      with open(os.path.join(runs_dir, fname)) as f:
        out.append(json.load(f))
  return out


def find_same_run(results_dir, spec):
  """A finished summary of `spec`'s exact settings (same key) in a sibling sweep, or None.

  Runs are identified by their settings, not their sweep: table2 and table3 compare DFPO and
  GSPO runs that table1 already made, with the same config, overrides and seeds.
  """
  own = os.path.abspath(results_dir)
  root = os.path.dirname(own)
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    other = os.path.join(root, name)
    if other == own or not os.path.isdir(os.path.join(other, 'runs')):
      continue
    for s in load_summaries(other):
      if s.get('key') == spec.key and s.get('seed') == spec.seed:
        return s
  return None


def reuse_summary(summary, spec):
  """`summary` relabelled as `spec`'s run of `spec.sweep`, remembering where it was made."""
  return dict(summary, sweep=spec.sweep, run=spec.run.name, label=spec.run.label,
              group=spec.run.group, reused_from=summary.get('reused_from', summary['sweep']))


def _write_json(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Launching.
# ---------------------------------------------------------------------------------------------

def _say(*args):
  print(*args, flush=True)


def _tail(path, n=STDERR_TAIL_LINES):
  if not os.path.exists(path):
    return ''
  with open(path, errors='replace') as f:
    return ''.join(f.readlines()[-n:])


def execute(spec, *, results_dir, workroot, make_command=trainer_command, log=_say):
  """Runs (or resumes, skips, reuses) one spec: ('skipped'|'reused'|'ok'|'failed', detail)."""
  spath = summary_path(results_dir, spec)
  if os.path.exists(spath):
    with open(spath) as f:
      if json.load(f).get('key') == spec.key:
        return 'skipped', spath
    log(f'[{spec.run_id}] settings changed since its summary was written: re-running')
  same = find_same_run(results_dir, spec)
  if same is not None:
    _write_json(spath, reuse_summary(same, spec))
    return 'reused', f'from {same["sweep"]}'
  workdir = os.path.join(workroot, spec.sweep, f'{spec.run_id}__{spec.key}')
  os.makedirs(workdir, exist_ok=True)
  command = make_command(spec, workdir)
  wall_path = os.path.join(workdir, 'runner_wall_time_s')
  wall = float(open(wall_path).read()) if os.path.exists(wall_path) else 0.0
  records = read_metrics(workdir)
  if not is_finished(records, spec.num_steps):
    log(f'[{spec.run_id}] start: {shlex.join(command)}')
    t0 = time.time()
    with open(os.path.join(workdir, 'stdout.log'), 'a') as out, \
         open(os.path.join(workdir, 'stderr.log'), 'w') as err:
      rc = subprocess.run(command, cwd=ROOT, stdout=out, stderr=err, check=False).returncode
    wall += time.time() - t0
    with open(wall_path, 'w') as f:
      f.write(repr(wall))
    records = read_metrics(workdir)
    failed_path = os.path.join(results_dir, 'runs', f'{spec.run_id}.failed.txt')
    if rc != 0 or not is_finished(records, spec.num_steps):
      why = (f'exit status {rc}' if rc != 0 else
             f'exit status 0 but metrics.jsonl has no step {spec.num_steps}')
      detail = f'{why}\n$ {shlex.join(command)}\n{_tail(os.path.join(workdir, "stderr.log"))}'
      os.makedirs(os.path.dirname(failed_path), exist_ok=True)
      with open(failed_path, 'w') as f:
        f.write(detail)
      return 'failed', detail
    if os.path.exists(failed_path):
      os.remove(failed_path)
  _write_json(spath, make_summary(spec, workdir, records, wall_time_s=wall, command=command))
  return 'ok', f'{wall:.0f}s'


def run_sweep(sweep, *, seeds, jobs, results_dir, workroot, make_command=trainer_command,
              validate=True, log=_say):
  """Runs every spec (bounded parallelism); returns {run_id: (status, detail)}."""
  specs = make_specs(sweep, seeds)
  total = len(specs)
  results = {}
  invalid = {}
  if validate:
    for spec in specs[:len(sweep.runs)]:       # the configs differ by run, not by seed
      try:
        validate_spec(spec)
      except ValueError as e:
        invalid[spec.run.name] = str(e)
        log(f'[{spec.run.name}] INVALID, not launched: {e}')
  for spec in specs:
    if spec.run.name in invalid:
      results[spec.run_id] = ('failed', invalid[spec.run.name])
  specs = [s for s in specs if s.run.name not in invalid]
  lock = threading.Lock()

  def locked_log(*args):                           # one line at a time from parallel runs
    with lock:
      log(*args)

  def one(spec):
    try:
      status, detail = execute(spec, results_dir=results_dir, workroot=workroot,
                               make_command=make_command, log=locked_log)
    except Exception as e:  # pylint: disable=broad-except
      status, detail = 'failed', f'{type(e).__name__}: {e}'
    with lock:
      results[spec.run_id] = (status, detail)
      log(f'[{spec.run_id}] {status} ({len(results)}/{total})'
          + (f'\n{detail}' if status == 'failed' else ''))

  with concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
    list(pool.map(one, specs))
  return results


# ---------------------------------------------------------------------------------------------
# Per-run scalars: '<extractor>:<key>' (a key starting with '~' = first curve containing it).
# ---------------------------------------------------------------------------------------------

def _curve(summary, key):
  curves = summary['curves']
  if key.startswith('~'):
    matches = sorted(k for k in curves if key[1:] in k)
    matches = [k for k in matches if 'high' in k] or matches
    key = matches[0] if matches else key
  elif key.endswith('@'):                         # 'eval/avg@' -> 'eval/avg@K'
    matches = sorted(k for k in curves if k.startswith(key))
    key = matches[0] if matches else key
  c = curves.get(key)
  if not c or not c['value']:
    return None, None
  return np.asarray(c['step'], np.float64), np.asarray(c['value'], np.float64)


def _final(summary, key, **_):
  _, v = _curve(summary, key)
  return float('nan') if v is None else float(v[-1])


def _mean(summary, key, **_):
  _, v = _curve(summary, key)
  return float('nan') if v is None else float(v.mean())


def _late_mean(summary, key, **_):
  """Mean over the last quarter of the curve (at least one point)."""
  _, v = _curve(summary, key)
  return float('nan') if v is None else float(v[-max(len(v) // 4, 1):].mean())


def _jitter2(summary, key, **_):
  _, v = _curve(summary, key)
  if v is None or len(v) < 3:
    return float('nan')
  return float(curves.jitter2(v))


def _compute_at(summary, key, *, threshold=None):
  """Generated tokens when `key` first reaches `threshold` (NaN if never)."""
  steps, v = _curve(summary, key)
  cs, cv = _curve(summary, 'compute/generated_tokens')
  if v is None or cv is None:
    return float('nan')
  compute = np.interp(steps, cs, cv)
  out = float(curves.compute_at_threshold(v, compute, threshold, smooth=SMOOTH_STEPS,
                                           interpolate=True))
  return out if np.isfinite(out) else float('nan')


EXTRACTORS = {
    'final': _final,
    'mean': _mean,
    'late_mean': _late_mean,
    'jitter2': _jitter2,
    'compute_at': _compute_at,
}


def metric_value(summary, metric, **kwargs):
  name, _, key = metric.partition(':')
  if name not in EXTRACTORS:
    raise ValueError(f'unknown metric extractor {name!r} in {metric!r}; valid: '
                     f'{sorted(EXTRACTORS)}')
  return EXTRACTORS[name](summary, key, **kwargs)


def auto_threshold(summaries, key, *, window=SMOOTH_STEPS):
  """0.9 x the smallest per-label seed-mean of the final `window`-step trailing mean of `key`.

  Every method's average run ends above the threshold, so compute-to-threshold is defined for
  most seeds of every method.
  """
  by_label = {}
  for s in summaries:
    _, v = _curve(s, key)
    if v is not None:
      by_label.setdefault((s.get('group', ''), s['label']), []).append(
          curves.trailing_mean(v, window)[-1])
  if not by_label:
    return float('nan')
  return 0.9 * min(float(np.mean(v)) for v in by_label.values())


# ---------------------------------------------------------------------------------------------
# Tables.
# ---------------------------------------------------------------------------------------------

def _ci_str(mean, lo, hi, scale, digits):
  if not np.isfinite(mean):
    return 'n/a'
  if not np.isfinite(lo):
    return f'{mean * scale:.{digits}f}'
  return f'{mean * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]'


def _p_str(p):
  if not np.isfinite(p):
    return 'n/a'
  return f'{p:.3f}' if p >= 0.001 else f'{p:.1e}'


def _verdict(diff, p, expect, alpha=0.05):
  if not expect or not np.isfinite(diff):
    return ''
  if diff == 0:
    return 'no difference'
  same = diff > 0 if expect == '>' else diff < 0
  if same:
    return 'agrees' if np.isfinite(p) and p < alpha else 'same direction, n.s.'
  return 'DISAGREES' if np.isfinite(p) and p < alpha else 'opposite direction, n.s.'


def _values_by_seed(summaries, table, threshold):
  """{(group, label): {seed: value}} over finite values."""
  out = {}
  for s in summaries:
    v = metric_value(s, table.metric, threshold=threshold)
    if np.isfinite(v):
      out.setdefault((s.get('group', ''), s['label']), {})[s['seed']] = v
  return out


def compare(values, base, *, normalize=False, seed=0):
  """Stats of `values` ({seed: v}) against `base` ({seed: v}), paired over common seeds."""
  x = np.array([values[k] for k in sorted(values)])
  row = {'n': len(x)}
  if normalize:
    denom = np.mean(list(base.values())) if base else float('nan')
    ok = len(x) and np.isfinite(denom) and denom != 0
    row['value'] = stats.bootstrap_ci(x / denom, seed=seed) if ok else (np.nan,) * 3
  else:
    row['value'] = stats.bootstrap_ci(x, seed=seed)
  common = sorted(set(values) & set(base or {}))
  row['n_pairs'] = len(common)
  if len(common) >= 1 and values is not base:
    xp = np.array([values[k] for k in common])
    bp = np.array([base[k] for k in common])
    if normalize:
      row['diff'] = stats.ratio_of_means_ci(xp, bp, seed=seed)
    else:
      row['diff'] = stats.paired_bootstrap_ci(xp, bp, seed=seed)
    row['p'] = stats.paired_bootstrap_pvalue(xp, bp, seed=seed)
  else:
    row['diff'], row['p'] = (np.nan,) * 3, np.nan
  return row


def build_table(sweep, table, summaries):
  """Markdown lines of one table from the summaries of `sweep`."""
  threshold = table.threshold
  if threshold == 'auto':
    base_key = table.metric.partition(':')[2]
    threshold = auto_threshold(summaries, base_key)
  values = _values_by_seed(summaries, table, threshold)
  baseline = table.baseline or sweep.baseline
  labels = list(dict.fromkeys(r.label for r in sweep.runs))
  if table.rows:
    labels = [l for l in labels if l in table.rows]
  groups = list(dict.fromkeys(r.group for r in sweep.runs))
  paper, expect = dict(table.paper), dict(table.expect)
  digits = 3 if table.normalize or table.scale == 1.0 else 1
  lines = [f'### {table.title}', '']
  if threshold is not None:
    lines += [f'Threshold: {table.metric.partition(":")[2]} >= {threshold:.4g} '
              f'({"auto" if table.threshold == "auto" else "fixed"}).', '']
  unit = f' {table.unit}' if table.unit else ''
  if table.by_group:
    others = [l for l in labels if l != baseline]
    head = ['Group'] + [f'{l}{unit}' for l in labels]
    head += [f'{o} - {baseline}' for o in others] + ['p', 'seeds', 'paper', 'vs paper']
    lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for g in groups:
      base = values.get((g, baseline), {})
      cells = [g or '-']
      rows = {l: compare(values.get((g, l), {}), base) for l in labels}
      cells += [_ci_str(*rows[l]['value'], table.scale, digits) for l in labels]
      for o in others:
        cells += [_ci_str(*rows[o]['diff'], table.scale, digits) + '', _p_str(rows[o]['p']),
                  str(rows[o]['n_pairs'])]
        cells += [paper.get(g, ''), _verdict(rows[o]['diff'][0], rows[o]['p'], expect.get(g))]
      lines.append('| ' + ' | '.join(cells) + ' |')
  else:
    base = values.get(('', baseline), {})
    diff_head = (f'ratio to {baseline}' if table.normalize
                 else f'diff vs {baseline}')
    head = ['Method', f'value{unit}', diff_head, 'p', 'seeds', 'paper', 'vs paper']
    lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for l in labels:
      vals = values.get(('', l), {})
      is_base = l == baseline
      row = compare(vals, vals if is_base else base, normalize=table.normalize)
      diff = row['diff'] if not is_base else (np.nan,) * 3
      effect = diff[0] - 1.0 if table.normalize else diff[0]
      n_total = sum(1 for s in summaries if s['label'] == l and s.get('group', '') == '')
      seeds_str = str(row['n']) if row['n'] == n_total else f'{row["n"]}/{n_total}'
      lines.append('| ' + ' | '.join([
          l + (' (baseline)' if is_base else ''),
          _ci_str(*row['value'], table.scale if not table.normalize else 1.0, digits),
          '' if is_base else _ci_str(*diff, 1.0 if table.normalize else table.scale, digits),
          '' if is_base else _p_str(row['p']), seeds_str, paper.get(l, ''),
          '' if is_base else _verdict(effect, row['p'], expect.get(l))]) + ' |')
  lines += ['']
  return lines


STATS_NOTE = (
    'Values: mean over seeds [95% percentile-bootstrap CI of the mean, 10,000 resamples]. '
    '`diff`/`ratio`: paired by seed against the baseline, with its bootstrap CI; `p`: two-sided '
    'paired bootstrap p-value of "no difference" (centred resampling of the per-seed '
    'differences, see experiments/stats.py). `seeds` k/n: k of n runs had a finite value (for '
    'compute-to-threshold: reached the threshold). `vs paper`: whether the difference has the '
    'paper\'s sign relative to the baseline, and is significant at p < 0.05. Caution: with '
    'n = 3-5 seeds the bootstrap is anti-conservative (all n differences of one sign give p near '
    '0), whereas an exact paired sign-flip test cannot go below 2/2^n (0.25 for 3 seeds, 0.0625 '
    'for 5); read a small p at n = 3 as "the same sign on every seed", and read the CIs.')


# ---------------------------------------------------------------------------------------------
# Plots.
# ---------------------------------------------------------------------------------------------

def plot_curves(sweep, summaries, out_path):
  """Mean over seeds +- one standard error, per run label (and group), for curve_keys."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  keys = list(sweep.curve_keys) + ['eval/avg@']
  n_cols = 3
  n_rows = (len(keys) + n_cols - 1) // n_cols
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.4 * n_cols, 3.0 * n_rows), squeeze=False)
  runs = list(dict.fromkeys((r.group, r.label) for r in sweep.runs))
  # One distinct (colour, line style) per curve: tab10 colours, then dashed, then dotted.
  styles = [(plt.cm.tab10(i % 10), ('-', '--', ':')[i // 10 % 3]) for i in range(len(runs))]
  for ax, key in zip(axes.flat, keys):
    shown = key
    for (group, label), (color, ls) in zip(runs, styles):
      xs, ys = [], []
      for s in summaries:
        if s['label'] != label or s.get('group', '') != group:
          continue
        steps, v = _curve(s, key)
        if v is None:
          continue
        if sweep.plot_x != 'step':
          cs, cv = _curve(s, sweep.plot_x)
          if cv is None:
            continue
          steps = np.interp(steps, cs, cv)
        xs.append(steps)
        ys.append(v)
        shown = key if not key.endswith('@') and not key.startswith('~') else next(
            (k for k in s['curves'] if (key[1:] if key.startswith('~') else key) in k), key)
      if not ys:
        continue
      n = min(len(y) for y in ys)
      x = np.mean([x[:n] for x in xs], axis=0)
      y = np.array([y[:n] for y in ys])
      mean = y.mean(0)
      se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(mean)
      name = f'{label} {group}'.strip()
      ax.plot(x, mean, lw=1.2, color=color, ls=ls, label=name)
      ax.fill_between(x, mean - se, mean + se, color=color, alpha=0.2, lw=0)
    ax.set_title(shown, fontsize=9)
    ax.set_xlabel(sweep.plot_x, fontsize=8)
    ax.tick_params(labelsize=7)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis('off')
  handles, labels = [], []
  for ax in axes.flat:
    h, l = ax.get_legend_handles_labels()
    if len(h) > len(handles):
      handles, labels = h, l
  if handles:
    fig.legend(handles, labels, loc='lower center', ncol=min(len(labels), 4), fontsize=8)
  fig.tight_layout(rect=(0, 0.04 + 0.025 * ((len(labels) + 3) // 4), 1, 1))
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path


# ---------------------------------------------------------------------------------------------
# The results file.
# ---------------------------------------------------------------------------------------------

def code_revision():
  """'<sha>' or '<sha> (dirty)'; 'unknown' outside a git checkout or without commits."""
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return f'{sha} (dirty)' if dirty else sha


def write_results(sweep, *, results_dir, md_path, command, wall_time_s, failures=None,
                  revision=None, plot=True, rebuilt_by=None):
  """Builds the markdown (+ plots) from the summaries in `results_dir`; returns md_path.

  `command`, `wall_time_s`, `revision`: of the invocation that ran the sweep; `rebuilt_by`: the
  `--tables-only` command that rebuilt the file, if any.
  """
  by_name = {r.name: r for r in sweep.runs}       # labels and groups: as the sweep says now
  summaries = [dict(s, label=by_name[s['run']].label, group=by_name[s['run']].group)
               for s in load_summaries(results_dir)
               if s['run'] in by_name and s['num_steps'] == sweep.num_steps]
  stale = len(load_summaries(results_dir)) - len(summaries)
  seeds = sorted({s['seed'] for s in summaries})
  run_wall = sum(s.get('wall_time_s') or 0.0 for s in summaries)
  lines = [f'# {sweep.name}{" (smoke)" if sweep.smoke else ""}', '', sweep.description, '',
           f'- Command: `{command}`',
           f'- Code revision: `{revision or code_revision()}`',
           *([f'- Tables rebuilt from the per-run summaries by `{rebuilt_by}` at revision '
              f'`{code_revision()}`'] if rebuilt_by else []),
           f'- Wall time of the sweep: {wall_time_s / 60:.1f} min; summed wall time of '
           f'the runs: {run_wall / 60:.1f} min',
           f'- Runs: {len(summaries)} summaries ({len(sweep.runs)} configs x seeds {seeds}), '
           f'{sweep.num_steps} RL steps each; shared overrides: '
           f'`{" ".join(f"--config.{k}={_fmt(v)}" for k, v in sweep.shared) or "none"}`'
           + (f'; config arg `:{sweep.config_arg}`' if sweep.config_arg else ''),
           '- Compute matching: equal RL steps, prompts x G per step, max tokens and update '
           'steps within a comparison (see experiments/sweeps.py); generated tokens per run:']
  tok = {}
  for s in summaries:
    tok.setdefault(f'{s["label"]} {s.get("group", "")}'.strip(), []).append(
        s['compute'].get('compute/generated_tokens', float('nan')))
  lines += [f'  {k}: {np.mean(v):.0f}' for k, v in tok.items()]
  reused = sorted({s['reused_from'] for s in summaries if s.get('reused_from')})
  if reused:
    n = sum(1 for s in summaries if s.get('reused_from'))
    lines += [f'- {n} of these runs have exactly the settings of runs in {", ".join(reused)} '
              'and were reused from there, not re-run (their summaries say `reused_from`).']
  if stale:
    lines += [f'- {stale} summaries with other settings (e.g. another num_steps) were ignored.']
  lines += ['', '## Tables', '']
  for table in sweep.tables:
    try:
      lines += build_table(sweep, table, summaries)
    except Exception as e:  # pylint: disable=broad-except
      lines += [f'### {table.title}', '', f'Could not build: {type(e).__name__}: {e}', '']
  lines += [STATS_NOTE, '']
  if plot and summaries:
    png = os.path.join(results_dir, 'curves.png')
    plot_curves(sweep, summaries, png)
    rel = os.path.relpath(png, os.path.dirname(md_path))
    lines += ['## Curves', '', f'![curves]({rel})', '',
              'Mean over seeds, shaded +- one standard error.', '']
  if failures:
    lines += ['## Failed runs', '']
    for run_id, detail in sorted(failures.items()):
      lines += [f'- `{run_id}`:', '', '```', detail.strip(), '```', '']
  notes = md_path[:-len('.md')] + '.notes.md'
  if os.path.exists(notes):
    with open(notes) as f:
      lines += [f'## Discussion (written by hand in {os.path.basename(notes)}; kept when the '
                'tables are rebuilt)', '', f.read().strip(), '']
  with open(md_path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return md_path


def failures_on_disk(results_dir):
  runs_dir = os.path.join(results_dir, 'runs')
  out = {}
  if os.path.isdir(runs_dir):
    for fname in sorted(os.listdir(runs_dir)):
      if fname.endswith('.failed.txt'):
        with open(os.path.join(runs_dir, fname)) as f:
          out[fname[:-len('.failed.txt')]] = f.read()
  return out


def result_paths(sweep_name, *, smoke, results_root=RESULTS_DIR):
  """(results_dir, md_path): results/<sweep>/ and results/<sweep>.md (under smoke/ if smoke)."""
  root = os.path.join(results_root, 'smoke') if smoke else results_root
  return os.path.join(root, sweep_name), os.path.join(root, f'{sweep_name}.md')


def main(argv=None, *, make_command=trainer_command, results_root=RESULTS_DIR):
  parser = argparse.ArgumentParser(prog='python -m experiments.run',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('sweep', help=f'one of {sorted(sweeps_lib.SWEEPS)}')
  parser.add_argument('--seeds', type=int, default=None, help='default: the sweep\'s own')
  parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1)
  parser.add_argument('--smoke', action='store_true')
  parser.add_argument('--workroot', default=DEFAULT_WORKROOT)
  parser.add_argument('--num-steps', type=int, default=None,
                      help='replaces the sweep\'s num_steps knob')
  parser.add_argument('--tables-only', action='store_true',
                      help='rebuild the results file from the run summaries; run nothing')
  args = parser.parse_args(argv)
  if args.sweep not in sweeps_lib.SWEEPS:
    parser.error(f'unknown sweep {args.sweep!r}; valid: {sorted(sweeps_lib.SWEEPS)}')
  sweep = sweeps_lib.get_sweep(args.sweep, smoke=args.smoke, num_steps=args.num_steps)
  seeds = args.seeds or sweep.seeds
  results_dir, md_path = result_paths(sweep.name, smoke=args.smoke, results_root=results_root)
  os.makedirs(results_dir, exist_ok=True)
  command = 'python -m experiments.run ' + shlex.join(sys.argv[1:] if argv is None else argv)
  t0 = time.time()
  failures = {}
  invocation_path = os.path.join(results_dir, 'invocation.json')
  if not args.tables_only:
    est = sweeps_lib.estimate_seconds(sweep, seeds=seeds)
    print(f'{sweep.name}: {len(sweep.runs)} configs x {seeds} seeds, {sweep.num_steps} steps; '
          f'estimated {est / 60:.0f} min of machine time', flush=True)
    results = run_sweep(sweep, seeds=seeds, jobs=args.jobs, results_dir=results_dir,
                        workroot=args.workroot, make_command=make_command)
    failures = {k: d for k, (s, d) in results.items() if s == 'failed'}
    invocation = {'command': command, 'wall_time_s': time.time() - t0,
                  'revision': code_revision()}
    _write_json(invocation_path, invocation)
  else:
    failures = failures_on_disk(results_dir)
    invocation = {'command': command, 'wall_time_s': 0.0, 'revision': None}
    if os.path.exists(invocation_path):              # the sweep's own command and wall time
      with open(invocation_path) as f:
        invocation = json.load(f)
  path = write_results(sweep, results_dir=results_dir, md_path=md_path,
                       command=invocation['command'], wall_time_s=invocation['wall_time_s'],
                       revision=invocation['revision'], failures=failures,
                       rebuilt_by=command if args.tables_only else None)
  print(f'wrote {path}' + (f'; {len(failures)} run(s) FAILED: {sorted(failures)}'
                           if failures else ''))
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
