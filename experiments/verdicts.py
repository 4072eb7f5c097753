r"""The table of claims: every claim of experiments/sweeps/claims.py measured from the per-run
summaries, corrected for multiplicity, with its verdict.

  python -m experiments.verdicts     # -> experiments/results/claims.csv, claims.md,
                                     #    claims_forest.png, claims_forest_exploratory.png

Per claim: the per-seed differences d = arm - baseline (paired by seed, in the claim's units),
their mean ``delta`` and Student-t 95% CI, the exact two-sided sign-flip p (every sign pattern up
to 20 seeds), Holm's adjusted p within the claim's family, the Benjamini-Hochberg q over all
claims, and the TOST equivalence p against +-SESOI. ``crn`` says whether the two arms were
evaluated on the same problems with the same sampling keys (common random numbers, checked on the
runs' `eval/crn`).

Verdict rules (`verdict`, tested on constructed data):
  agrees / disagrees   Holm p < 0.05, the paper's predicted sign / the opposite; the verdict says
                       whether the CI contains the paper's delta.
  equivalent (+-SESOI) TOST p < 0.05 and no Holm-significant difference. For a negative control
                       (predicted '=') that is 'agrees'; a significant difference 'disagrees'.
  inconclusive         anything else (with the sign it showed).
"""

import argparse
import csv
import os

import numpy as np

from experiments import report
from experiments import stats
from experiments.sweeps import claims as claims_lib
from jtc import files

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')
ALPHA = 0.05
COLUMNS = ('claim', 'family', 'kind', 'sweep', 'metric', 'arm', 'baseline', 'group', 'comparison',
           'n_seeds', 'first_seed', 'delta', 'ci_low', 'ci_high', 'p_exact', 'p_holm', 'q_bh',
           'tost_p', 'sesoi', 'paper_delta', 'predicted', 'unit', 'crn', 'verdict')


def _by_seed(summaries, label, group, claim):
  """{seed: (value x scale, eval/crn or None)} of one arm."""
  out = {}
  for s in summaries:
    if s['label'] == label and s.get('group', '') == group:
      v = report.metric_value(s, claim.metric, threshold=claim.threshold)
      if np.isfinite(v):
        out[s['seed']] = (v * claim.scale, s['final'].get('eval/crn'))
  return out


def comparison(claim):
  """'arm - baseline (group)'; for a difference of differences, '(...) - (...)'."""
  text = f'{claim.arm} - {claim.baseline}' + (f' ({claim.group})' if claim.group else '')
  if not claim.minus:
    return text
  arm, base, group = claim.minus
  return f'({text}) - ({arm} - {base}' + (f' ({group}))' if group else ')')


def measure(claim, summaries):
  """The row of ``claim`` before the corrections: paired differences and their statistics."""
  arm = _by_seed(summaries, claim.arm, claim.group, claim)
  base = _by_seed(summaries, claim.baseline, claim.group, claim)
  pairs = [(arm, base)]
  if claim.minus:  # a difference of differences, paired by seed
    arm2, base2, group2 = claim.minus
    pairs.append((_by_seed(summaries, arm2, group2, claim), _by_seed(summaries, base2, group2,
                                                                     claim)))
  seeds = sorted(set.intersection(*[set(a) & set(b) for a, b in pairs]))
  sign = (1.0, -1.0)
  d = np.array([sum(s_ * (a[s][0] - b[s][0]) for s_, (a, b) in zip(sign, pairs)) for s in seeds])
  crns = [(a[s][1], b[s][1]) for a, b in pairs for s in seeds]
  if not crns or any(a is None or b is None for a, b in crns):
    crn = 'n/a'
  else:
    crn = 'same' if all(a == b for a, b in crns) else 'DIFFERENT'
  mean, lo, hi = stats.t_ci(d) if len(d) else (np.nan,) * 3
  return dict(claim=claim.name, family=claim.family, kind=claim.kind, sweep=claim.sweep,
              metric=claim.metric, arm=claim.arm, baseline=claim.baseline, group=claim.group,
              comparison=comparison(claim), n_seeds=len(d), first_seed=min(seeds) if seeds else '',
              delta=mean, ci_low=lo, ci_high=hi,
              p_exact=stats.paired_signflip_pvalue(d, np.zeros_like(d)) if len(d) else np.nan,
              tost_p=stats.tost_pvalue(d, claim.sesoi) if claim.sesoi and len(d) else np.nan,
              sesoi=claim.sesoi if claim.sesoi else np.nan,
              paper_delta=np.nan if claim.paper_delta is None else claim.paper_delta,
              predicted=claim.predicted, unit=claim.unit, crn=crn)


def correct(rows):
  """Adds p_holm (within each family) and q_bh (over all rows) and the verdicts. A declared
  claim without data counts as p = 1 (never rejected), so each correction is over the claims as
  declared, not over those that happened to run; its own p_holm / q_bh stay NaN."""
  declared = [r['p_exact'] if np.isfinite(r['p_exact']) else 1.0 for r in rows]
  for r, q_r in zip(rows, stats.benjamini_hochberg(declared)):
    r['q_bh'] = q_r if np.isfinite(r['p_exact']) else np.nan
  for family in dict.fromkeys(r['family'] for r in rows):
    members = [i for i, r in enumerate(rows) if r['family'] == family]
    for i, p in zip(members, stats.holm([declared[i] for i in members])):
      rows[i]['p_holm'] = p if np.isfinite(rows[i]['p_exact']) else np.nan
  for r in rows:
    r['verdict'] = verdict(r)
  return rows


def _fmt(x, digits=2):
  return f'{x:+.{digits}f}' if np.isfinite(x) else 'n/a'


def verdict(row, alpha=ALPHA):
  """The verdict of a corrected row (module docstring)."""
  delta, p_holm, tost = row['delta'], row['p_holm'], row['tost_p']
  if not np.isfinite(delta) or row['n_seeds'] < 2:
    return 'inconclusive (no data)'
  predicted, paper = row['predicted'], row['paper_delta']
  significant = np.isfinite(p_holm) and p_holm < alpha
  equivalent = np.isfinite(tost) and tost < alpha
  band = f'within +-{row["sesoi"]:g} {row["unit"]}'.rstrip()
  if predicted == '=':
    if significant:
      return 'disagrees (the control differs)'
    return f'agrees (equivalent {band})' if equivalent else 'inconclusive'
  if significant and predicted in '<>':
    same = (delta > 0) == (predicted == '>')
    out = 'agrees' if same else 'disagrees'
    if np.isfinite(paper):
      inside = row['ci_low'] <= paper <= row['ci_high']
      out += f' (CI {"contains" if inside else "excludes"} the paper\'s {_fmt(paper, 1)})'
    return out
  if significant:
    return 'differs'
  if equivalent:
    if predicted in '<>' and np.isfinite(paper):
      return f'equivalent {band}: no effect, where the paper has {_fmt(paper, 1)}'
    return f'equivalent {band}'
  sign = ''
  if predicted in '<>' and delta != 0:
    sign = "; paper's sign" if (delta > 0) == (predicted == '>') else '; opposite sign'
  return f'inconclusive{sign}'


def build(claims, results_dir=RESULTS_DIR):
  """The corrected rows of ``claims`` from the committed per-run summaries."""
  cache = {}
  rows = []
  for claim in claims:
    if claim.sweep not in cache:
      cache[claim.sweep] = report.load_summaries(os.path.join(results_dir, claim.sweep))
    rows.append(measure(claim, cache[claim.sweep]))
  return correct(rows)


def write_csv(rows, path):
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for r in rows:
      writer.writerow({k: (f'{v:.6g}' if isinstance(v, float) else v) for k, v in r.items()})
  return path


def read_csv(path):
  """Rows of a claims.csv with numbers as floats (what the corrections recompute from)."""
  numeric = ('n_seeds', 'delta', 'ci_low', 'ci_high', 'p_exact', 'p_holm', 'q_bh', 'tost_p',
             'sesoi', 'paper_delta')
  with open(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    for k in numeric:
      r[k] = float(r[k]) if r[k] not in ('', 'nan') else np.nan
    r['n_seeds'] = int(r['n_seeds']) if np.isfinite(r['n_seeds']) else 0
  return rows


def _p(p):
  return 'n/a' if not np.isfinite(p) else (f'{p:.3g}' if p >= 1e-4 else f'{p:.1e}')


def markdown(rows, *, forest_paths=()):
  """claims.md: the rules, then one table per family (confirmatory families first)."""
  lines = [
      '# Claims', '',
      'Every claim of `experiments/sweeps/claims.py`, measured from the per-run summaries by '
      f'`python -m experiments.verdicts` at revision `{report.code_revision()}` (also '
      '`claims.csv`). delta: mean paired difference arm - '
      'baseline over seeds [Student-t 95% CI]; p: exact two-sided sign-flip test; Holm: adjusted '
      'within the family; BH: Benjamini-Hochberg q over all claims; TOST: equivalence within '
      '+-SESOI. agrees / disagrees need Holm p < 0.05; "equivalent" needs TOST p < 0.05; '
      'everything else is inconclusive. Exploratory claims come from the runs (seeds 0-7) that '
      'chose the confirmatory settings and are never the headline.', ''
  ]
  lines += [f'![forest]({os.path.basename(p)})' for p in forest_paths] + ['']
  head = ('claim', 'comparison', 'seeds', 'delta [95% CI]', 'paper', 'p', 'Holm', 'BH', 'TOST',
          'verdict')
  for kind in ('confirmatory', 'exploratory'):
    lines += [f'## {kind.capitalize()} claims', '']
    for family in dict.fromkeys(r['family'] for r in rows if r['kind'] == kind):
      members = [r for r in rows if r['family'] == family and r['kind'] == kind]
      unit = members[0]['unit']
      lines += [
          f'### {family}' + (f' ({unit})' if unit else ''), '', '| ' + ' | '.join(head) + ' |',
          '|' + '---|' * len(head)
      ]
      for r in members:
        digits = 1 if r['unit'] == 'points' else 4
        ci = (f'{_fmt(r["delta"], digits)} [{_fmt(r["ci_low"], digits)}, '
              f'{_fmt(r["ci_high"], digits)}]')
        seeds = f'{r["n_seeds"]} (from {r["first_seed"]})' if r['n_seeds'] else '0'
        crn = '' if r['crn'] in ('same', 'n/a') else ' CRN broken'
        lines.append('| ' + ' | '.join([
            r['claim'], r['comparison'], seeds, ci,
            _fmt(r['paper_delta'], 1),
            _p(r['p_exact']),
            _p(r['p_holm']),
            _p(r['q_bh']),
            _p(r['tost_p']), r['verdict'] + crn
        ]) + ' |')
      lines.append('')
  missing = sorted({r['sweep'] for r in rows if r['n_seeds'] == 0})
  if missing:
    lines += [
        'Claims with no data are those whose sweep has not been run yet: ' +
        ', '.join(f'`python -m experiments.run {s}`' for s in missing) + '.', ''
    ]
  return '\n'.join(lines) + '\n'


_COLORS = {'agrees': 'tab:green', 'disagrees': 'tab:red', 'equivalent': 'tab:blue'}


def forest(rows, path, title):
  """Delta and 95% CI per claim, one panel per family (its own units), the paper's delta as a
  cross, each claim's +-SESOI band shaded, 0 as a line; a claim without data says so."""
  from jtc.analysis import plot  # pylint: disable=import-outside-toplevel
  plt = plot.plt
  families = list(dict.fromkeys(r['family'] for r in rows))
  heights = [max(1.2, 0.42 * sum(r['family'] == f for r in rows) + 0.8) for f in families]
  fig, axes = plt.subplots(len(families), 1, figsize=(8.5, sum(heights)), squeeze=False,
                           gridspec_kw={'height_ratios': heights})
  for ax, family in zip(axes[:, 0], families):
    members = [r for r in rows if r['family'] == family][::-1]
    y = np.arange(len(members))
    ax.axvline(0, color='0.4', lw=0.8)
    for i, r in enumerate(members):
      if np.isfinite(r['sesoi']):
        ax.add_patch(plt.Rectangle((-r['sesoi'], i - 0.4), 2 * r['sesoi'], 0.8, color='0.85', lw=0))
      if not r['n_seeds']:
        ax.text(0, i, ' no data (not run) ', ha='center', va='center', fontsize=7, color='0.3')
      color = _COLORS.get(r['verdict'].split(' ')[0], 'tab:gray')
      if np.isfinite(r['ci_low']):
        ax.plot([r['ci_low'], r['ci_high']], [i, i], color=color, lw=2)
      ax.plot(r['delta'], i, 'o', color=color, ms=5)
      if np.isfinite(r['paper_delta']):
        ax.plot(r['paper_delta'], i, 'x', color='k', ms=7, mew=1.5)
    ax.set_yticks(y)
    ax.set_yticklabels([
        f'{r["claim"]}: {r["arm"]} - {r["baseline"]}' + (f' ({r["group"]})' if r['group'] else '')
        for r in members
    ], fontsize=8)
    unit = members[0]['unit']
    ax.set_title(family + (f' ({unit})' if unit else ''), fontsize=9, loc='left')
    ax.tick_params(axis='x', labelsize=8)
    ax.grid(axis='x', alpha=0.3)
    ax.set_ylim(-0.7, len(members) - 0.3)
  handles = [
      plt.Line2D([], [], color='tab:green', marker='o', label="agrees (the paper's sign)"),
      plt.Line2D([], [], color='tab:red', marker='o', label='disagrees'),
      plt.Line2D([], [], color='tab:blue', marker='o', label='equivalent (within +-SESOI)'),
      plt.Line2D([], [], color='tab:gray', marker='o', label='inconclusive'),
      plt.Line2D([], [], color='k', marker='x', ls='', label="paper's delta"),
      plt.Rectangle((0, 0), 1, 1, color='0.85', label='+-SESOI')
  ]
  fig.legend(handles=handles, loc='lower center', ncol=3, fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0.06, 1, 0.97))
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def write(rows, results_dir=RESULTS_DIR):
  """claims.csv, claims.md and the two forest plots in ``results_dir``; returns their paths."""
  csv_path = write_csv(rows, os.path.join(results_dir, 'claims.csv'))
  confirmatory = [r for r in rows if r['kind'] == 'confirmatory']
  exploratory = [r for r in rows if r['kind'] == 'exploratory' and r['unit'] == 'points']
  plots = []
  if confirmatory:
    plots.append(
        forest(confirmatory, os.path.join(results_dir, 'claims_forest.png'),
               'Confirmatory claims: arm - baseline, mean and 95% CI over 16 fresh seeds'))
  if exploratory:
    plots.append(
        forest(exploratory, os.path.join(results_dir, 'claims_forest_exploratory.png'),
               'Exploratory accuracy claims (seeds 0-7): arm - baseline, mean and 95% CI'))
  md_path = os.path.join(results_dir, 'claims.md')
  with open(md_path, 'w') as f:
    f.write(markdown(rows, forest_paths=plots))
  return [csv_path, md_path] + plots


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--results', default=RESULTS_DIR, help='where the sweeps\' results are')
  args = parser.parse_args(argv)
  rows = build(claims_lib.all_claims(), args.results)
  for path in write(rows, args.results):
    print(path)


if __name__ == '__main__':
  with files.report_damage():
    main()
