"""Results files of a sweep: tables with their statistics, the markdown (the per-run values they
show are `experiments.common`'s).

Everything here reads the per-run summaries that `experiments/run.py` writes, so a results file
can be rebuilt on any machine (`python -m experiments.run <sweep> --tables-only`).

Statistics (experiments/stats.py): a value is the mean over seeds with its 95% percentile
bootstrap CI; a comparison is paired by seed against the table's baseline, with the Student-t CI
of the mean difference and the exact paired sign-flip p-value, uncorrected. Verdicts are given
only on declared claims (experiments/sweeps/claims.py), corrected for multiplicity by
experiments/verdicts.py; a table row shows the verdict of the claim it answers.
"""

import dataclasses
import os
import re

import numpy as np

from experiments import common
from experiments import figures
from experiments import stats
from experiments import verdicts
from experiments.sweeps import claims
from experiments.sweeps.base import FINAL_AVG, FINAL_PASS
from jtc import files

# ---------------------------------------------------------------------------------------------
# Tables.
# ---------------------------------------------------------------------------------------------


def _values_by_seed(summaries, table, threshold):
  """{(group, label): {seed: value}} over finite values."""
  out = {}
  for s in summaries:
    v = common.metric_value(s, table.metric, threshold=threshold)
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


def build_table(sweep, table, summaries, declared=None):
  """Markdown lines of one table from the summaries of `sweep`, in long format: one row per
  (group, run), with its value, its paired difference from the table's baseline and, for a
  declared claim, the claim and its verdict (``declared``: {(group, label): (claim, verdict)},
  from experiments.verdicts, multiplicity-corrected over the claim's family)."""
  threshold = table.threshold
  if threshold == 'auto':
    threshold = common.auto_threshold(summaries, table.metric.partition(':')[2])
  values = _values_by_seed(summaries, table, threshold)
  baseline = table.baseline or sweep.baseline
  labels = list(dict.fromkeys(r.label for r in sweep.runs))
  if table.rows:
    labels = [l for l in labels if l in table.rows]
  groups = list(dict.fromkeys(r.group for r in sweep.runs))
  paper, declared = dict(table.paper), declared or {}
  digits = table.digits if table.digits is not None else (
      3 if table.normalize or table.scale == 1.0 else 1)
  lines = [f'### {table.title}', '']
  if table.prediction:
    lines += [
        f'Prediction (written before the run; its source named first): {table.prediction}', ''
    ]
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
      claim, v = declared.get((g, l), ('', ''))
      lines.append('| ' + ' | '.join([
          g or '-', l + (' (baseline)' if is_base else ''),
          common.ci_str(*row['value'], table.scale if not table.normalize else 1.0, digits),
          '' if is_base else common.ci_str(*row['diff'], 1.0 if table.normalize else table.scale,
                                           digits), '' if is_base else common.p_str(row['p']),
          str(row['n']) if row['n'] == n_total else f'{row["n"]}/{n_total}',
          paper.get(l, paper.get(g, '')) if not is_base else '', f'{claim}: {v}' if claim else ''
      ]) + ' |')
  lines += ['']
  return lines


def pass_at_k_table(table, summaries):
  """The companion of an avg@k table: the same rows in unbiased pass@K (Chen et al. 2021) from
  the same K samples, K the largest logged; None for another metric or summaries without
  pass@ (runs made before it was logged). Descriptive: no prediction, no claim."""
  if table.metric != FINAL_AVG:
    return None
  ks = {
      int(m[1])
      for s in summaries
      for k in s.get('curves', {})
      if (m := re.fullmatch(r'eval/pass@(\d+)', k))
  }
  if not ks or max(ks) < 2:
    return None
  return dataclasses.replace(
      table, title=f'{table.title}: pass@{max(ks)} (unbiased, from the same samples)',
      metric=FINAL_PASS, prediction='', expect=(), paper=())


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


def result_paths(sweep_name, *, smoke, scratch=False, results_root):
  """(results_dir, md_path): <root>/<sweep>/ and <root>/<sweep>.md, under smoke/ or scratch/
  for the small and the resized forms of a sweep (never the committed results)."""
  root = results_root
  if smoke:
    root = os.path.join(results_root, 'smoke')
  elif scratch:
    root = os.path.join(results_root, 'scratch')
  return os.path.join(root, sweep_name), os.path.join(root, f'{sweep_name}.md')


def read_parts(invocation_path):
  """The parts recorded in ``invocation_path`` so far ([] before the first)."""
  if not os.path.exists(invocation_path):
    return []
  return invocation_parts(files.read_json(invocation_path, expected="a sweep's invocation record"))


def invocation_parts(invocation):
  """The parts of a sweep's invocation.json: [{command, wall_time_s, revision}, ...]. A file
  written before sweeps could run in parts holds one invocation, not a list."""
  return invocation.get('parts', [invocation])


def _declared_verdicts(sweep, results_root):
  """{(metric, baseline, group, arm): (claim, verdict)} of the claims measured on ``sweep``'s
  runs, each corrected over its whole family (experiments/verdicts.py); a difference of
  differences (``Claim.minus``) is not what any table row shows and is left to claims.md."""
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
      f'- Command: `{command}`', f'- Code revision: `{revision or common.code_revision()}`', *([
          f'- Tables rebuilt from the per-run summaries by `{rebuilt_by}` at revision '
          f'`{common.code_revision()}`'
      ] if rebuilt_by else []),
      f'- Wall time of the sweep: {wall_time_s / 60:.1f} min; summed wall time of '
      f'the runs: {run_wall / 60:.1f} min',
      f'- Runs: {len(summaries)} summaries ({len(sweep.runs)} configs x seeds {seeds}), '
      f'{sweep.num_steps} RL steps each; shared overrides: '
      f'`{" ".join(f"--config.{k}={common.fmt_value(v)}" for k, v in sweep.shared) or "none"}`' +
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
      for s in common.load_summaries(results_dir)
      if s['run'] in by_name and s['num_steps'] == sweep.num_steps
  ]
  stale = len(common.load_summaries(results_dir)) - len(summaries)
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
    companion = pass_at_k_table(table, summaries)
    if companion is not None:
      lines += build_table(sweep, companion, summaries)
  lines += [STATS_NOTE, '']
  if plot and summaries:
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
