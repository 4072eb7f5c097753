"""Results files of a sweep: per-run scalars, tables with their statistics, the markdown.

Everything here reads the per-run summaries that `experiments/run.py` writes, so a results file
can be rebuilt on any machine (`python -m experiments.run <sweep> --tables-only`).

Statistics (experiments/stats.py): a value is the mean over seeds with its 95% percentile
bootstrap CI; a comparison is paired by seed against the table's baseline, with the Student-t CI
of the mean difference and the exact paired sign-flip p-value, uncorrected. Verdicts are given
only on declared claims (experiments/sweeps/claims.py), corrected for multiplicity by
experiments/verdicts.py; a table row shows the verdict of the claim it answers.
"""

import os
import subprocess

import numpy as np

from experiments import stats
from jtc import files
from jtc.analysis import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOOTH_STEPS = 5  # trailing mean of the reward before compute_at_threshold
# What every per-run summary holds (experiments.summaries.make_summary writes it).
SUMMARY_KEYS = ('run', 'seed', 'num_steps', 'key', 'workdir', 'final', 'curves')

# ---------------------------------------------------------------------------------------------
# Per-run scalars: '<extractor>:<key>' (a key ending in '@' = the first curve starting with it).
# ---------------------------------------------------------------------------------------------


def curve(summary, key):
  """(steps, values) float64 arrays of a summary's curve, or (None, None).

  ``'A - B'`` is the difference of two curves logged at the same steps (e.g. the log-odds
  between two equivalent solutions, ``format_logq/a - format_logq/b``).
  """
  if ' - ' in key:
    a, b = (k.strip() for k in key.split(' - ', 1))
    (sa, va), (sb, vb) = curve(summary, a), curve(summary, b)
    if va is None or vb is None:
      return None, None
    if not np.array_equal(sa, sb):
      raise ValueError(f'curves {a!r} and {b!r} are logged at different steps; '
                       f'{key!r} needs the same steps')
    return sa, va - vb
  stored = summary['curves']
  if key.endswith('@'):  # 'eval/avg@' -> 'eval/avg@K'
    matches = sorted(k for k in stored if k.startswith(key))
    key = matches[0] if matches else key
  c = stored.get(key)
  if not c or not c['value']:
    return None, None
  return np.asarray(c['step'], np.float64), np.asarray(c['value'], np.float64)


def _final(summary, key, **_):
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v[-1])


def _mean(summary, key, **_):
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v.mean())


def _late_mean(summary, key, **_):
  """Mean over the last quarter of the curve (at least one point)."""
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v[-max(len(v) // 4, 1):].mean())


def _change(summary, key, **_):
  """Last value minus first value (e.g. the drift of a log-odds over training)."""
  _, v = curve(summary, key)
  return float('nan') if v is None or len(v) < 2 else float(v[-1] - v[0])


def _jitter2(summary, key, **_):
  _, v = curve(summary, key)
  if v is None or len(v) < 3:
    return float('nan')
  return float(curves.jitter2(v))


def _compute_at(summary, key, *, threshold=None):
  """Generated tokens when `key` first reaches `threshold` (NaN if never)."""
  steps, v = curve(summary, key)
  cs, cv = curve(summary, 'compute/generated_tokens')
  if v is None or cv is None:
    return float('nan')
  compute = np.interp(steps, cs, cv)
  out = float(
      curves.compute_at_threshold(v, compute, threshold, smooth=SMOOTH_STEPS, interpolate=True))
  return out if np.isfinite(out) else float('nan')


EXTRACTORS = {
    'final': _final,
    'mean': _mean,
    'late_mean': _late_mean,
    'change': _change,
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
    _, v = curve(s, key)
    if v is not None:
      by_label.setdefault((s.get('group', ''), s['label']),
                          []).append(curves.trailing_mean(v, window)[-1])
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
  return f'{p:.3g}' if p >= 1e-4 else f'{p:.1e}'


def _values_by_seed(summaries, table, threshold):
  """{(group, label): {seed: value}} over finite values."""
  out = {}
  for s in summaries:
    v = metric_value(s, table.metric, threshold=threshold)
    if np.isfinite(v):
      out.setdefault((s.get('group', ''), s['label']), {})[s['seed']] = v
  return out


def compare(values, base, *, normalize=False, seed=0):
  """Stats of `values` ({seed: v}) against `base` ({seed: v}), paired over common seeds:
  value CI, diff (or ratio) CI, sign-flip p, bootstrap p, n, n_pairs."""
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
  row['diff'], row['p'], row['p_boot'] = (np.nan,) * 3, np.nan, np.nan
  if len(common) >= 1 and values is not base:
    xp = np.array([values[k] for k in common])
    bp = np.array([base[k] for k in common])
    if normalize:
      row['diff'] = stats.ratio_of_means_ci(xp, bp, seed=seed)
      # The sign-flip test on the per-seed differences tests "ratio = 1" too.
    else:
      row['diff'] = stats.t_ci(xp - bp)
    row['p'] = stats.paired_signflip_pvalue(xp, bp, seed=seed)
    row['p_boot'] = stats.paired_bootstrap_pvalue(xp, bp, seed=seed)
  return row


def build_table(sweep, table, summaries, verdicts=None):
  """Markdown lines of one table from the summaries of `sweep`, in long format: one row per
  (group, run), with its value, its paired difference from the table's baseline and, for a
  declared claim, the claim and its verdict (``verdicts``: {(group, label): (claim, verdict)},
  from experiments.verdicts, multiplicity-corrected over the claim's family)."""
  threshold = table.threshold
  if threshold == 'auto':
    threshold = auto_threshold(summaries, table.metric.partition(':')[2])
  values = _values_by_seed(summaries, table, threshold)
  baseline = table.baseline or sweep.baseline
  labels = list(dict.fromkeys(r.label for r in sweep.runs))
  if table.rows:
    labels = [l for l in labels if l in table.rows]
  groups = list(dict.fromkeys(r.group for r in sweep.runs))
  paper, verdicts = dict(table.paper), verdicts or {}
  digits = table.digits if table.digits is not None else (
      3 if table.normalize or table.scale == 1.0 else 1)
  lines = [f'### {table.title}', '']
  if table.prediction:
    lines += [f'Prediction (from the paper, written before the run): {table.prediction}', '']
  if threshold is not None:
    lines += [
        f'Threshold: {table.metric.partition(":")[2]} >= {threshold:.4g} '
        f'({"auto" if table.threshold == "auto" else "fixed"}).', ''
    ]
  ref = '0' if table.against_zero else baseline
  unit = f' {table.unit}' if table.unit else ''
  head = [
      'group', 'run', f'value{unit}', f'ratio to {ref}' if table.normalize else f'diff vs {ref}',
      'p (sign-flip)', 'seeds', 'paper', 'claim: verdict'
  ]
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for g in groups:
    base = values.get((g, baseline), {})
    for l in labels:
      vals = values.get((g, l), {})
      if not vals and not any(r.group == g and r.label == l for r in sweep.runs):
        continue
      is_base = l == baseline and not table.against_zero
      against = dict.fromkeys(vals, 0.0) if table.against_zero else vals if is_base else base
      row = compare(vals, against, normalize=table.normalize)
      n_total = sum(1 for s in summaries if s['label'] == l and s.get('group', '') == g)
      claim, v = verdicts.get((g, l), ('', ''))
      lines.append('| ' + ' | '.join([
          g or '-', l + (' (baseline)' if is_base else ''),
          _ci_str(*row['value'], table.scale if not table.normalize else 1.0, digits),
          '' if is_base else _ci_str(*row['diff'], 1.0 if table.normalize else table.scale, digits),
          '' if is_base else _p_str(row['p']),
          str(row['n']) if row['n'] == n_total else f'{row["n"]}/{n_total}',
          paper.get(l, paper.get(g, '')) if not is_base else '', f'{claim}: {v}' if claim else ''
      ]) + ' |')
  lines += ['']
  return lines


STATS_NOTE = (
    'Values: mean over seeds [95% percentile-bootstrap CI of the mean]. `diff`: paired by seed '
    'against the baseline, mean [Student-t 95% CI]; `ratio`: of the means, with its paired '
    'bootstrap CI. `p (sign-flip)`: exact two-sided paired permutation test of the per-seed '
    'differences, uncorrected (its floor is 2/2^n: 0.0078 for 8 seeds). `seeds` k/n: k of n '
    'runs had a finite value. Verdicts are given only on declared claims, corrected for '
    'multiplicity (Holm within the claim\'s family, experiments/results/claims.md).')

# ---------------------------------------------------------------------------------------------
# The results file.
# ---------------------------------------------------------------------------------------------


def code_revision():
  """'<sha>' or '<sha> (dirty)'; 'unknown' outside a git checkout or without commits. Only
  code counts as dirty: results files (experiments/results/) being rewritten do not."""
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dirty = subprocess.run([
        'git', 'status', '--porcelain', '--untracked-files=no', '--', '.', ':!experiments/results'
    ], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return f'{sha} (dirty)' if dirty else sha


def fmt_value(value):
  """How a config value is written on a command line (floats by repr: 1e-4 stays 1e-4)."""
  return repr(value) if isinstance(value, float) else str(value)


def read_summary(path):
  """One per-run summary (`files.DamagedFile` when it is not one)."""
  return files.read_json(path, keys=SUMMARY_KEYS, expected='a run summary')


def load_summaries(results_dir):
  """Every per-run summary in `<results_dir>/runs/`."""
  runs_dir = os.path.join(results_dir, 'runs')
  if not os.path.isdir(runs_dir):
    return []
  return [
      read_summary(os.path.join(runs_dir, f))
      for f in sorted(os.listdir(runs_dir))
      if f.endswith('.json')
  ]


def failures_on_disk(results_dir):
  runs_dir = os.path.join(results_dir, 'runs')
  out = {}
  if os.path.isdir(runs_dir):
    for fname in sorted(os.listdir(runs_dir)):
      if fname.endswith('.failed.txt'):
        with open(os.path.join(runs_dir, fname)) as f:
          out[fname[:-len('.failed.txt')]] = f.read()
  return out


def _declared_verdicts(sweep, results_root):
  """{(metric, baseline, group, arm): (claim, verdict)} of the claims measured on ``sweep``'s
  runs, each corrected over its whole family (experiments/verdicts.py); a difference of
  differences (``Claim.minus``) is not what any table row shows and is left to claims.md."""
  from experiments import verdicts  # pylint: disable=import-outside-toplevel
  from experiments.sweeps import claims  # pylint: disable=import-outside-toplevel
  every = claims.all_claims()
  families = {c.family for c in every if c.sweep == sweep.name}
  claims_here = [c for c in every if c.family in families]
  rows = verdicts.build(claims_here, results_root)
  return {
      (r['metric'], r['baseline'], r['group'], r['arm']): (r['claim'], r['verdict'])
      for r, c in zip(rows, claims_here)
      if r['sweep'] == sweep.name and not c.minus
  }


def _header(sweep, summaries, *, stale, command, wall_time_s, revision, rebuilt_by):
  """The results file's first lines: the command, revision, wall time, runs and compute."""
  seeds = sorted({s['seed'] for s in summaries})
  run_wall = sum(s.get('wall_time_s') or 0.0 for s in summaries)
  lines = [
      f'# {sweep.name}{" (smoke)" if sweep.smoke else ""}', '', sweep.description, '',
      f'- Command: `{command}`', f'- Code revision: `{revision or code_revision()}`', *([
          f'- Tables rebuilt from the per-run summaries by `{rebuilt_by}` at revision '
          f'`{code_revision()}`'
      ] if rebuilt_by else []),
      f'- Wall time of the sweep: {wall_time_s / 60:.1f} min; summed wall time of '
      f'the runs: {run_wall / 60:.1f} min',
      f'- Runs: {len(summaries)} summaries ({len(sweep.runs)} configs x seeds {seeds}), '
      f'{sweep.num_steps} RL steps each; shared overrides: '
      f'`{" ".join(f"--config.{k}={fmt_value(v)}" for k, v in sweep.shared) or "none"}`' +
      (f'; config arg `:{sweep.config_arg}`' if sweep.config_arg else ''),
      '- Compute matching: equal RL steps, prompts x G per step, max tokens and update '
      'steps within a comparison (see experiments/sweeps/); generated tokens per run:'
  ]
  tok = {}
  for s in summaries:
    tok.setdefault(f'{s["label"]} {s.get("group", "")}'.strip(),
                   []).append(s['compute'].get('compute/generated_tokens', float('nan')))
  lines += [f'  {k}: {np.mean(v):.0f}' for k, v in tok.items()]
  reused = sorted({s['reused_from'] for s in summaries if s.get('reused_from')})
  if reused:
    n = sum(1 for s in summaries if s.get('reused_from'))
    lines += [
        f'- {n} of these runs have exactly the settings of runs in {", ".join(reused)} '
        'and were reused from there, not re-run (their summaries say `reused_from`).'
    ]
  if stale:
    lines += [f'- {stale} summaries with other settings (e.g. another num_steps) were ignored.']
  return lines


def write_results(sweep, *, results_dir, md_path, command, wall_time_s, failures=None,
                  revision=None, plot=True, rebuilt_by=None):
  """Builds the markdown (+ plots) from the summaries in `results_dir`; returns md_path.

  `command`, `wall_time_s`, `revision`: of the invocation that ran the sweep; `rebuilt_by`: the
  `--tables-only` command that rebuilt the file, if any. Only summaries of the sweep's own runs
  and num_steps count.
  """
  by_name = {r.name: r for r in sweep.runs}  # labels and groups: as the sweep says now
  summaries = [
      dict(s, label=by_name[s['run']].label, group=by_name[s['run']].group)
      for s in load_summaries(results_dir)
      if s['run'] in by_name and s['num_steps'] == sweep.num_steps
  ]
  stale = len(load_summaries(results_dir)) - len(summaries)
  lines = _header(sweep, summaries, stale=stale, command=command, wall_time_s=wall_time_s,
                  revision=revision, rebuilt_by=rebuilt_by)
  lines += ['', '## Tables', '']
  declared = _declared_verdicts(sweep, os.path.dirname(os.path.abspath(results_dir)))
  for table in sweep.tables:
    try:
      baseline = table.baseline or sweep.baseline
      lines += build_table(
          sweep, table, summaries, {
              (g, arm): v
              for (metric, base, g, arm), v in declared.items()
              if metric == table.metric and base == baseline
          })
    except Exception as e:  # pylint: disable=broad-except
      lines += [f'### {table.title}', '', f'Could not build: {type(e).__name__}: {e}', '']
  lines += [STATS_NOTE, '']
  if plot and summaries:
    from experiments import figures  # pylint: disable=import-outside-toplevel
    png = os.path.join(results_dir, 'curves.png')
    figures.plot_curves(sweep, summaries, png)
    rel = os.path.relpath(png, os.path.dirname(md_path))
    lines += [
        '## Curves', '', f'![curves]({rel})', '', 'Mean over seeds, shaded +- one standard error.',
        ''
    ]
  if failures:
    lines += ['## Failed runs', '']
    for run_id, detail in sorted(failures.items()):
      lines += [f'- `{run_id}`:', '', '```', detail.strip(), '```', '']
  notes = md_path[:-len('.md')] + '.notes.md'
  if os.path.exists(notes):
    with open(notes) as f:
      lines += [
          f'## Discussion (written by hand in {os.path.basename(notes)}; kept when the '
          'tables are rebuilt)', '',
          f.read().strip(), ''
      ]
  with open(md_path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return md_path
