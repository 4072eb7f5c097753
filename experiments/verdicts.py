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

Verdict rules (`verdict`, tested on constructed data). A verdict speaks of signs and
equivalence at this scale, never of sizes: the paper's delta was measured in another setting
(`Claim.paper_setting`) and is shown in its own column, not compared with ours.
  agrees in sign /     Holm p < 0.05 in the predicted sign / the opposite one.
  disagrees in sign
  equivalent (+-SESOI) TOST p < 0.05 and no Holm-significant difference: "equivalent within
                       +-SESOI at this scale".
  '=' predicted        'agrees' when equivalent (TOST p < 0.05; a smaller difference may also be
                       significant), 'disagrees' when the difference is significant and at
                       least the SESOI, 'not shown equivalent' when it is significant but
                       smaller than the SESOI and TOST fails.
  inconclusive         anything else (with the sign it showed).
  not yet run          a declared claim whose sweep has no runs: no verdict, not tallied.
Implementation checks (kind 'check': arms identical by construction) are judged alone (holds /
fails), outside the corrections and the tallies; so are descriptive checks (kind 'descriptive':
one quantity against a declared threshold, judged by the same rules without correction). Claims
on jtc's own accounts (``subject`` 'jtc') are listed apart from the verdicts on the papers and
not tallied with them. Every row names the platform its sweep ran on (`platform_of`: CPU or the
GPU), since the same seed and settings differ across platforms. Claims whose arms are bit-identical to an
earlier claim's of the family on every seed (e.g. two corrections that reduce to the same weights)
are one test: they are marked ``same_as`` and counted once by Holm and by BH.
"""

import argparse
import csv
import json
import os
import re

import numpy as np

from experiments import common
from experiments import figures
from experiments import stats
from experiments.sweeps import claims as claims_lib
from jtc import files

RESULTS_DIR = common.results_dir()
ALPHA = 0.05
COUNTED = ('confirmatory', 'exploratory')  # kinds the corrections and the tallies count
COLUMNS = ('claim', 'family', 'kind', 'subject', 'platform', 'sweep', 'metric', 'arm', 'baseline',
           'group', 'comparison', 'n_seeds', 'first_seed', 'delta', 'ci_low', 'ci_high', 'p_exact',
           'p_holm', 'q_bh', 'tost_p', 'sesoi', 'paper_delta', 'paper_setting', 'predicted', 'unit',
           'crn', 'same_as', 'verdict')


def _by_seed(summaries, label, group, claim):
  """{seed: (value x scale, eval/crn or None)} of one arm."""
  out = {}
  for s in summaries:
    if s['label'] == label and s.get('group', '') == group:
      v = common.metric_value(s, claim.metric, threshold=claim.threshold)
      if np.isfinite(v):
        out[s['seed']] = (v * claim.scale, s['final'].get('eval/crn'))
  return out


def platform_of(results_dir):
  """Where a sweep's runs ran, from its invocation.json: each part's 'platform' (written by
  experiments/run.py since issue 54) or, for earlier parts, the note the device runs put after
  the revision ('<sha> (on one NVIDIA H200, jax 0.11.2)'); 'CPU' without a note; 'not run'
  without parts. Several platforms are joined with ' + '."""
  path = os.path.join(results_dir, 'invocation.json')
  if not os.path.exists(path):
    return 'not run'
  with open(path) as f:
    parts = json.load(f).get('parts', [])
  found = []
  for part in parts:
    name = part.get('platform')
    if not name:
      note = re.search(r'\(on (?:one )?([^,)]+)', part.get('revision', ''))
      name = f'GPU ({note.group(1)})' if note else 'CPU'
    if name not in found:
      found.append(name)
  return ' + '.join(found) or 'not run'


def comparison(claim):
  """'arm - baseline (group)' ('arm (against 0)' without a baseline); for a difference of
  differences, '(...) - (...)'."""
  if not claim.baseline:
    return f'{claim.arm} (against 0)' + (f' ({claim.group})' if claim.group else '')
  text = f'{claim.arm} - {claim.baseline}' + (f' ({claim.group})' if claim.group else '')
  if not claim.minus:
    return text
  arm, base, group = claim.minus
  return f'({text}) - ({arm} - {base}' + (f' ({group}))' if group else ')')


def measure(claim, summaries, platform=''):
  """The row of ``claim`` before the corrections: paired differences and their statistics."""
  arm = _by_seed(summaries, claim.arm, claim.group, claim)
  if claim.baseline:
    base = _by_seed(summaries, claim.baseline, claim.group, claim)
  else:  # against 0: the arm's own values, the "baseline" 0 on the same seeds
    base = {s: (0.0, crn) for s, (_, crn) in arm.items()}
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
  arms = tuple((s, tuple(v[s][0] for pair in pairs for v in pair)) for s in seeds)
  return dict(claim=claim.name, family=claim.family, kind=claim.kind, subject=claim.subject,
              platform=platform, sweep=claim.sweep, metric=claim.metric, arm=claim.arm,
              baseline=claim.baseline, group=claim.group, comparison=comparison(claim),
              n_seeds=len(d), first_seed=min(seeds) if seeds else '', delta=mean, ci_low=lo,
              ci_high=hi,
              p_exact=stats.paired_signflip_pvalue(d, np.zeros_like(d)) if len(d) else np.nan,
              tost_p=stats.tost_pvalue(d, claim.sesoi) if claim.sesoi and len(d) else np.nan,
              sesoi=claim.sesoi if claim.sesoi else np.nan,
              paper_delta=np.nan if claim.paper_delta is None else claim.paper_delta,
              paper_setting=claim.paper_setting, predicted=claim.predicted, unit=claim.unit,
              crn=crn, same_as='', arms=arms, note=claim.note)


def mark_duplicates(rows):
  """Sets ``same_as`` on every row whose arms' per-seed values (arm and baseline, on the same
  seeds) are bit-identical to an earlier row's of its family and kind: the same test twice."""
  first = {}
  for r in rows:
    if not r.get('arms'):
      continue
    key = (r['family'], r['kind'], r['arms'])
    if key in first:
      r['same_as'] = first[key]
    else:
      first[key] = r['claim']
  return rows


def correct(rows):
  """Adds p_holm (within each family) and q_bh (over all rows) and the verdicts. A declared
  claim without data counts as p = 1 (never rejected), so each correction is over the claims as
  declared, not over those that happened to run; its own p_holm / q_bh stay NaN. A row marked
  ``same_as`` another is not counted again and takes that row's corrected values; checks are
  not corrected at all."""
  counted = [i for i, r in enumerate(rows) if r['kind'] in COUNTED and not r.get('same_as')]
  declared = {i: rows[i]['p_exact'] if np.isfinite(rows[i]['p_exact']) else 1.0 for i in counted}
  for r in rows:
    r['p_holm'] = r['q_bh'] = np.nan
  for i, q_i in zip(counted, stats.benjamini_hochberg([declared[i] for i in counted])):
    rows[i]['q_bh'] = q_i if np.isfinite(rows[i]['p_exact']) else np.nan
  for family in dict.fromkeys(rows[i]['family'] for i in counted):
    members = [i for i in counted if rows[i]['family'] == family]
    for i, p in zip(members, stats.holm([declared[i] for i in members])):
      rows[i]['p_holm'] = p if np.isfinite(rows[i]['p_exact']) else np.nan
  by_name = {r['claim']: r for r in rows}
  for r in rows:
    if r.get('same_as'):
      r['p_holm'], r['q_bh'] = by_name[r['same_as']]['p_holm'], by_name[r['same_as']]['q_bh']
    r['verdict'] = check_verdict(r) if r['kind'] == 'check' else verdict(r)
  return rows


def check_verdict(row, alpha=ALPHA):
  """An implementation check: 'holds' when the arms are identical on every seed (or, failing
  that, equivalent within +-SESOI), else 'FAILS'."""
  if not np.isfinite(row['delta']) or row['n_seeds'] < 2:
    return 'not yet run (declared)'
  if row['delta'] == 0 and row['ci_low'] == row['ci_high'] == 0:  # every difference is 0
    return 'holds: identical on every seed'
  if np.isfinite(row['tost_p']) and row['tost_p'] < alpha:
    return f'holds: equivalent within +-{row["sesoi"]:g} {row["unit"]}'.rstrip()
  return 'FAILS'


def _fmt(x, digits=2):
  return f'{x:+.{digits}f}' if np.isfinite(x) else 'n/a'


def verdict(row, alpha=ALPHA):
  """The verdict of a corrected row (module docstring)."""
  delta, tost = row['delta'], row['tost_p']
  # A descriptive check is one test, judged alone: its own p, no family to correct over.
  p_holm = row['p_holm'] if row['kind'] in COUNTED else row['p_exact']
  if not np.isfinite(delta) or row['n_seeds'] < 2:
    return 'not yet run (declared)'
  predicted = row['predicted']
  significant = np.isfinite(p_holm) and p_holm < alpha
  equivalent = np.isfinite(tost) and tost < alpha
  band = f'equivalent within +-{row["sesoi"]:g} {row["unit"]}'.rstrip() + ' at this scale'
  if predicted == '=':
    if equivalent:
      return f'agrees: {band}' + ('; a smaller difference is significant' if significant else '')
    if significant:
      if abs(delta) >= row['sesoi']:
        return 'disagrees: the arms differ'
      return (
          f'not shown equivalent: a difference inside +-{row["sesoi"]:g} {row["unit"]}'.rstrip() +
          ' is significant')
    return 'inconclusive'
  if significant:
    if predicted not in '<>' or not predicted:
      return 'differs'
    return 'agrees in sign' if (delta > 0) == (predicted == '>') else 'disagrees in sign'
  if equivalent:
    return band
  sign = ''
  if predicted in ('<', '>') and delta != 0:
    sign = '; predicted sign' if (delta > 0) == (predicted == '>') else '; opposite sign'
  return f'inconclusive{sign}'


def build(claims, results_dir=RESULTS_DIR):
  """The corrected rows of ``claims`` from the committed per-run summaries."""
  cache = {}
  rows = []
  for claim in claims:
    if claim.sweep not in cache:
      sweep_dir = os.path.join(results_dir, claim.sweep)
      cache[claim.sweep] = (common.load_summaries(sweep_dir), platform_of(sweep_dir))
    summaries, platform = cache[claim.sweep]
    rows.append(measure(claim, summaries, platform))
  return correct(mark_duplicates(rows))


def write_csv(rows, path):
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction='ignore')
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


def tally(rows):
  """'N claims: a agree in sign, ...' over the claims of ``rows`` that count and ran (no
  checks, a bit-identical repeat once), then how many are declared and not yet run."""
  counted = [r for r in rows if r['kind'] in COUNTED and not r.get('same_as') and r['n_seeds']]
  unrun = sum(r['kind'] in COUNTED and not r['n_seeds'] for r in rows)
  words = {
      'agrees': 'agree',
      'disagrees': 'disagree',
      'equivalent': 'equivalent',
      'not shown equivalent': 'not shown equivalent',
      'inconclusive': 'inconclusive',
      'differs': 'differ'
  }
  counts = {label: sum(r['verdict'].startswith(w) for r in counted) for w, label in words.items()}
  parts = [f'{n} {label}' for label, n in counts.items() if n]
  return f'{len(counted)} claims: ' + ', '.join(parts) + (f'; {unrun} declared, not yet run'
                                                          if unrun else '')


def _paper(r):
  if not np.isfinite(r['paper_delta']):
    return 'n/a'
  return _fmt(r['paper_delta'], 1) + (f' ({r["paper_setting"]})' if r['paper_setting'] else '')


def _family_table(members):
  head = ('claim', 'comparison', 'platform', 'seeds', 'delta [95% CI]', 'p', 'Holm', 'BH', 'TOST',
          'verdict', "paper's delta (its setting)")
  unit = members[0]['unit']
  lines = [
      f'### {members[0]["family"]}' + (f' ({unit})' if unit else ''), '',
      '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)
  ]
  for r in members:
    digits = 1 if r['unit'] == 'points' else 4
    ci = f'{_fmt(r["delta"], digits)} [{_fmt(r["ci_low"], digits)}, {_fmt(r["ci_high"], digits)}]'
    seeds = f'{r["n_seeds"]} (from {r["first_seed"]})' if r['n_seeds'] else '0'
    notes = ('' if r['crn'] in ('same', 'n/a') else ' CRN broken') + (
        f' (the same runs as {r["same_as"]}: counted once)' if r.get('same_as') else '')
    lines.append('| ' + ' | '.join([
        r['claim'], r['comparison'],
        r.get('platform', ''), seeds, ci,
        common.p_str(r['p_exact']),
        common.p_str(r['p_holm']),
        common.p_str(r['q_bh']),
        common.p_str(r['tost_p']), r['verdict'] + notes,
        _paper(r)
    ]) + ' |')
  notes = [f'- {r["claim"]}: {r["note"]}' for r in members if r.get('note')]
  return lines + [''] + (notes + [''] if notes else [])


def markdown(rows, *, forest_paths=()):
  """claims.md: the rules, then one table per family: the confirmatory claims, the
  implementation checks (apart, not counted), the exploratory claims."""
  lines = [
      '# Claims', '',
      'Every claim of `experiments/sweeps/claims.py`, measured from the per-run summaries by '
      f'`python -m experiments.verdicts` at revision `{common.code_revision()}` (also '
      '`claims.csv`). delta: mean paired difference arm - '
      'baseline over seeds [Student-t 95% CI]; p: exact two-sided sign-flip test; Holm: adjusted '
      'within the family; BH: Benjamini-Hochberg q over all claims; TOST: equivalence within '
      '+-SESOI. "agrees / disagrees in sign" need Holm p < 0.05; "equivalent" needs TOST p < '
      '0.05; everything else is inconclusive. The verdicts speak of signs and equivalence at '
      "this scale only: the paper's delta was measured on another model, task and scale (its "
      'own column) and is not compared with ours. Implementation checks (arms identical by '
      'construction) are listed apart and counted nowhere; bit-identical repeats are counted '
      'once. Exploratory claims come from the runs (seeds 0-7) that chose the confirmatory '
      'settings and are never the headline. Claims on jtc\'s own accounts are listed apart '
      'from the verdicts on the papers. Every row names the platform its runs ran on (CPU or '
      'the GPU): the same seed and settings are not bit-identical across platforms (per run sd '
      'about 0.7 points for GSPO, 2.6 for DAPO, 2.1 for DelTA across a code change too), so a '
      'difference is only read '
      'within a platform.', ''
  ]
  lines += [f'![forest]({os.path.basename(p)})' for p in forest_paths] + ['']
  sections = (('confirmatory', 'paper', 'Confirmatory claims: verdicts on the papers'), (
      'confirmatory', 'jtc',
      "Confirmatory claims on jtc's own accounts (tested like the others; not verdicts on the "
      'papers, not tallied with them)'),
              ('descriptive', None,
               'Descriptive checks (one quantity against a declared threshold; '
               'not corrected, not counted)'),
              ('check', None, 'Implementation checks (identical by construction; not counted)'),
              ('exploratory', None, 'Exploratory claims'))
  for kind, subject, title in sections:
    of_kind = [
        r for r in rows if r['kind'] == kind and subject in (None, r.get('subject', 'paper'))
    ]
    if not of_kind:
      continue
    lines += [f'## {title}', '']
    if kind in COUNTED:
      lines += [tally(of_kind) + '.', '']
    for family in dict.fromkeys(r['family'] for r in of_kind):
      lines += _family_table([r for r in of_kind if r['family'] == family])
  missing = sorted({r['sweep'] for r in rows if r['n_seeds'] == 0})
  if missing:
    lines += [
        'Claims with no data are those whose sweep has not been run yet: ' +
        ', '.join(f'`python -m experiments.run {s}`' for s in missing) + '.', ''
    ]
  return '\n'.join(lines) + '\n'


def write(rows, results_dir=RESULTS_DIR):
  """claims.csv, claims.md and the two forest plots in ``results_dir``; returns their paths."""
  csv_path = write_csv(rows, os.path.join(results_dir, 'claims.csv'))
  confirmatory = [r for r in rows if r['kind'] == 'confirmatory']
  exploratory = [r for r in rows if r['kind'] == 'exploratory' and r['unit'] == 'points']
  plots = []
  if confirmatory:
    plots.append(
        figures.forest(
            confirmatory, os.path.join(results_dir, 'claims_forest.png'),
            'Confirmatory claims: arm - baseline, mean and 95% CI over 16 seeds [platform]'))
  if exploratory:
    plots.append(
        figures.forest(exploratory, os.path.join(results_dir, 'claims_forest_exploratory.png'),
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
