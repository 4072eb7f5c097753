"""experiments.verdicts: the verdict rules on constructed per-run summaries, where the right
answer is known by construction (a real effect, no effect, a control, too few seeds)."""
import os

import numpy as np
import pytest

from experiments import verdicts
from experiments.sweeps.base import Claim


def _summaries(deltas_by_arm, *, seeds, base_sd=0.05, seed=0):
  """Fake per-run summaries: arm 'BASE' and one arm per key of ``deltas_by_arm`` whose final
  eval/avg@4 is BASE's plus the given per-seed difference (fractions)."""
  rng = np.random.default_rng(seed)
  base = 0.5 + base_sd * rng.standard_normal(len(seeds))
  out = []
  for label, d in {'BASE': np.zeros(len(seeds)), **deltas_by_arm}.items():
    for s, b, di in zip(seeds, base, d):
      out.append({
          'label': label,
          'seed': s,
          'group': '',
          'final': {
              'eval/crn': 7
          },
          'curves': {
              'eval/avg@4': {
                  'step': [80],
                  'value': [float(b + di)]
              }
          }
      })
  return out


def _claim(arm, predicted, **kw):
  kw = {'name': f'c.{arm}', 'family': 'F', 'paper_delta': 5.0, 'sesoi': 1.0, **kw}
  return Claim(sweep='fake', metric='final:eval/avg@', arm=arm, baseline='BASE',
               predicted=predicted, **kw)


def _rows(claims, summaries):
  return verdicts.correct(verdicts.mark_duplicates([verdicts.measure(c, summaries) for c in claims
                                                   ]))


def test_measure_recovers_the_constructed_paired_difference():
  d = np.linspace(0.01, 0.03, 16)
  (row,) = _rows([_claim('UP', '>')], _summaries({'UP': d}, seeds=range(8, 24)))
  assert row['n_seeds'] == 16 and row['first_seed'] == 8
  assert row['delta'] == pytest.approx(100 * d.mean())
  assert row['ci_low'] < row['delta'] < row['ci_high']
  assert row['p_exact'] == pytest.approx(2 / 2**16)  # every seed up: the exact floor
  assert row['crn'] == 'same'


def test_a_difference_of_differences_is_paired_by_seed_and_named_as_such():
  """Claim.minus (the mismatch sweep's 'does the correction change DFPO - GSPO'): per seed,
  (arm - baseline in g) - (arm - baseline in h); each group's own baseline level cancels."""
  d_g, d_h = np.linspace(0.01, 0.03, 8), np.linspace(0.0, 0.05, 8)
  in_g = [dict(s, group='g') for s in _summaries({'UP': d_g}, seeds=range(8), seed=0)]
  in_h = [dict(s, group='h') for s in _summaries({'UP': d_h}, seeds=range(8), seed=1)]
  claim = _claim('UP', '>', group='g', minus=('UP', 'BASE', 'h'))
  (row,) = _rows([claim], in_g + in_h)
  assert row['n_seeds'] == 8
  assert row['delta'] == pytest.approx(100 * (d_g - d_h).mean())
  assert row['comparison'] == '(UP - BASE (g)) - (UP - BASE (h))'


def test_a_real_effect_agrees_or_disagrees_with_the_predicted_sign():
  rng = np.random.default_rng(1)
  up = 0.02 + 0.003 * rng.standard_normal(16)
  rows = _rows([_claim('UP', '>'), _claim('UP', '<', name='c.wrong')],
               _summaries({'UP': up}, seeds=range(16)))
  # Signs at this scale only: the paper's +5.0 (another setting) is not compared with.
  assert rows[0]['verdict'] == 'agrees in sign'
  assert rows[1]['verdict'] == 'disagrees in sign'
  # The same runs under two predictions are one (two-sided) test: Holm counts it once.
  assert rows[1]['same_as'] == 'c.UP'
  assert rows[0]['p_holm'] == rows[1]['p_holm'] == pytest.approx(rows[0]['p_exact'])


def test_no_effect_is_equivalent_only_with_enough_precision():
  rng = np.random.default_rng(2)
  tiny = 0.0005 * rng.standard_normal(16)  # |delta| << SESOI = 1 point, sd 0.05 points
  (row,) = _rows([_claim('SAME', '>')], _summaries({'SAME': tiny}, seeds=range(16)))
  assert row['verdict'] == 'equivalent within +-1 points at this scale' and row['tost_p'] < 0.05
  noisy = 0.03 * rng.standard_normal(16)  # sd 3 points: cannot exclude 1 point either way
  (row,) = _rows([_claim('NOISY', '>')], _summaries({'NOISY': noisy}, seeds=range(16)))
  assert row['verdict'].startswith('inconclusive') and row['tost_p'] > 0.05


def test_a_negative_control_agrees_when_equivalent_and_disagrees_when_it_differs():
  rng = np.random.default_rng(3)
  rows = _rows([_claim('NULL', '='), _claim('MOVED', '=')],
               _summaries(
                   {
                       'NULL': 0.0005 * rng.standard_normal(16),
                       'MOVED': 0.02 + 0.003 * rng.standard_normal(16)
                   }, seeds=range(16)))
  assert rows[0]['verdict'] == 'agrees: equivalent within +-1 points at this scale'
  assert rows[1]['verdict'] == 'disagrees: the arms differ'


def test_eight_seeds_cannot_survive_holm_over_a_family_of_seven():
  # Every seed up in every arm: the uncorrected p is the 8-seed floor 2/256 = 0.0078; Holm's
  # first step multiplies it by 7 -> 0.055 > 0.05, so nothing can be called. 16 seeds can.
  arms = {f'A{i}': np.full(8, 0.02 + 0.001 * i) for i in range(7)}
  rows = _rows([_claim(a, '>') for a in arms], _summaries(arms, seeds=range(8)))
  assert all(r['p_exact'] == pytest.approx(2 / 256) for r in rows)
  assert all(r['p_holm'] > 0.05 and r['verdict'].startswith('inconclusive') for r in rows)
  arms16 = {a: np.full(16, d[0]) for a, d in arms.items()}
  rows = _rows([_claim(a, '>') for a in arms16], _summaries(arms16, seeds=range(16)))
  assert all(r['verdict'].startswith('agrees') for r in rows)


def test_missing_runs_are_not_yet_run_untallied_and_still_count_in_their_family():
  rows = _rows([_claim('ABSENT', '>'), _claim('UP', '>')],
               _summaries({'UP': np.full(16, 0.02)}, seeds=range(16)))
  assert rows[0]['verdict'] == 'not yet run (declared)' and rows[0]['n_seeds'] == 0
  assert np.isnan(rows[0]['p_holm']) and np.isnan(rows[0]['q_bh'])
  # Holm over the declared family of two, not over the one claim that ran.
  assert rows[1]['p_holm'] == pytest.approx(2 * rows[1]['p_exact'])
  # A declared claim without runs is no verdict: not tallied as inconclusive, named apart.
  assert verdicts.tally(rows) == '1 claims: 1 agree; 1 declared, not yet run'


def test_different_evaluation_problems_are_flagged():
  s = _summaries({'UP': np.full(8, 0.02)}, seeds=range(8))
  s[-1]['final']['eval/crn'] = 8
  (row,) = _rows([_claim('UP', '>')], s)
  assert row['crn'] == 'DIFFERENT'


def test_claims_csv_round_trips_and_the_corrections_recompute_from_it(tmp_path):
  rng = np.random.default_rng(4)
  arms = {'UP': 0.02 + 0.003 * rng.standard_normal(16), 'FLAT': 0.01 * rng.standard_normal(16)}
  claims = [_claim('UP', '>'), _claim('FLAT', '>'), _claim('ABSENT', '<', family='G')]
  rows = _rows(claims, _summaries(arms, seeds=range(16)))
  paths = verdicts.write(rows, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == ['claims.csv', 'claims.md', 'claims_forest.png']
  back = verdicts.read_csv(paths[0])
  assert [r['claim'] for r in back] == [c.name for c in claims]
  assert set(verdicts.COLUMNS) <= set(back[0])
  again = verdicts.correct([{**r, 'p_holm': np.nan, 'q_bh': np.nan, 'verdict': ''} for r in back])
  for r, a in zip(back, again):
    np.testing.assert_allclose([a['p_holm'], a['q_bh']], [r['p_holm'], r['q_bh']], rtol=1e-5)
    assert a['verdict'] == r['verdict']
  md = open(paths[1]).read()
  assert '`python -m experiments.run fake`' in md  # the claim without data names its command


def test_an_implementation_check_is_judged_alone_and_counted_nowhere():
  """A check (arms identical by construction) holds when every seed's difference is 0, and it
  takes no part in Holm or BH: the family's claim is corrected as if it were alone."""
  rng = np.random.default_rng(5)
  up = 0.02 + 0.003 * rng.standard_normal(16)
  summ = _summaries({'UP': up, 'SAME': np.zeros(16), 'OFF': np.full(16, 0.01)}, seeds=range(16))
  rows = _rows([
      _claim('SAME', '=', kind='check'),
      _claim('OFF', '=', kind='check', name='c.off'),
      _claim('UP', '>')
  ], summ)
  assert rows[0]['verdict'] == 'holds: identical on every seed'
  assert rows[1]['verdict'] == 'FAILS'  # the known positive: a check that is not identical
  assert np.isnan(rows[0]['p_holm']) and np.isnan(rows[0]['q_bh'])
  assert rows[2]['p_holm'] == pytest.approx(rows[2]['p_exact'])  # a family of one
  assert verdicts.tally(rows) == '1 claims: 1 agree'


def test_bit_identical_arms_are_one_test():
  """Two claims whose arms are the same runs on every seed (two corrections that reduce to the
  same weights) count once: Holm over the family as if the repeat were not there. A claim whose
  arm differs on one seed by the smallest amount is a test of its own (the control)."""
  rng = np.random.default_rng(6)
  up = 0.02 + 0.003 * rng.standard_normal(16)
  other = up.copy()
  other[3] += 1e-9
  summ = _summaries({'UP': up, 'UP_AGAIN': up, 'UP_NEARLY': other}, seeds=range(16))
  rows = _rows([_claim('UP', '>'), _claim('UP_AGAIN', '>')], summ)
  assert rows[1]['same_as'] == 'c.UP' and not rows[0]['same_as']
  assert rows[0]['p_holm'] == rows[1]['p_holm'] == pytest.approx(rows[0]['p_exact'])
  rows = _rows([_claim('UP', '>'), _claim('UP_NEARLY', '>')], summ)
  assert not rows[1]['same_as']
  assert rows[0]['p_holm'] == pytest.approx(2 * rows[0]['p_exact'])


def test_a_significant_difference_inside_the_sesoi_is_not_shown_equivalent():
  """Issue 54: for '=' claims a difference that is significant but smaller than the SESOI (and
  not inside it by TOST) is 'not shown equivalent', not 'disagrees'; one at least the SESOI
  disagrees; one significant and inside the SESOI by TOST agrees."""
  rng = np.random.default_rng(7)
  z = rng.standard_normal(16)
  z = (z - z.mean()) / z.std(ddof=1)  # exactly mean 0, sd 1
  rows = _rows(
      [_claim('SMALL', '='), _claim('BIG', '='),
       _claim('TINY', '=')],
      _summaries(
          {
              'SMALL': 0.0085 + 0.009 * z,  # +0.85 [0.37, 1.33] points
              'BIG': 0.015 + 0.003 * rng.standard_normal(16),
              'TINY': 0.002 + 0.001 * rng.standard_normal(16)
          },
          seeds=range(16)))
  small, big, tiny = rows
  assert small['p_holm'] < 0.05 and abs(small['delta']) < 1.0 and small['tost_p'] >= 0.05
  assert small['verdict'] == 'not shown equivalent: a difference inside +-1 points is significant'
  assert big['verdict'] == 'disagrees: the arms differ'
  assert tiny['p_holm'] < 0.05 and tiny['verdict'].startswith('agrees: equivalent within +-1')
  assert tiny['verdict'].endswith('a smaller difference is significant')
  assert verdicts.tally(rows) == '3 claims: 1 agree, 1 disagree, 1 not shown equivalent'


def test_jtc_accounts_and_descriptive_checks_are_apart_and_rows_name_their_platform(tmp_path):
  """A claim on jtc's own account is listed under its own heading and not tallied among the
  verdicts on the papers; a descriptive check (against 0 with its threshold) is judged alone;
  every row of claims.csv / claims.md names its platform (from the sweep's invocation.json)."""
  rng = np.random.default_rng(8)
  summ = _summaries(
      {
          'UP': 0.02 + 0.003 * rng.standard_normal(16),
          'NEAR0': 0.001 * rng.standard_normal(16)
      }, seeds=range(16))
  claims = [
      _claim('UP', '>'),
      _claim('UP', '=', name='c.account', subject='jtc'),
      Claim('c.gap', family='D', sweep='fake', metric='final:eval/avg@', arm='NEAR0', baseline='',
            kind='descriptive', predicted='=', sesoi=60.0)
  ]
  rows = verdicts.correct([verdicts.measure(c, summ, 'GPU (NVIDIA H200)') for c in claims])
  assert rows[2]['comparison'] == 'NEAR0 (against 0)' and rows[2]['n_seeds'] == 16
  assert rows[2]['verdict'].startswith('agrees: equivalent within +-60')  # ~50 points, sd 0.1
  assert np.isnan(rows[2]['p_holm'])
  assert rows[0]['p_holm'] == pytest.approx(2 * rows[0]['p_exact'])  # F holds UP and the account
  paths = verdicts.write(rows, str(tmp_path))
  md = open(paths[1]).read()
  papers = md.split("## Confirmatory claims on jtc's own accounts")[0]
  assert '1 claims: 1 agree.' in papers and 'c.account' not in papers
  assert 'c.account' in md.split("## Confirmatory claims on jtc's own accounts")[1]
  assert '## Descriptive checks' in md and 'GPU (NVIDIA H200)' in md
  assert {r['platform'] for r in verdicts.read_csv(paths[0])} == {'GPU (NVIDIA H200)'}


def test_the_platform_is_read_from_the_invocation_parts(tmp_path):
  assert verdicts.platform_of(str(tmp_path)) == 'not run'
  parts = [{
      'revision': 'abc (on one NVIDIA H200, jax 0.11.2)'
  }, {
      'revision': 'def'
  }, {
      'revision': 'ghi',
      'platform': 'GPU (NVIDIA H100)'
  }]
  (tmp_path / 'invocation.json').write_text(__import__('json').dumps({'parts': parts}))
  assert verdicts.platform_of(str(tmp_path)) == 'GPU (NVIDIA H200) + CPU + GPU (NVIDIA H100)'


def test_the_committed_confirmatory_verdicts_recompute_from_the_committed_summaries():
  """Every confirmatory claim of claims.csv (and the implementation check) is what the committed
  per-run summaries give: the same seeds, delta, exact and Holm p (Holm is within a family, and
  every confirmatory family is in the confirmatory claims) and verdict; BH's q, over every claim,
  is left out. A declared claim whose sweep has not run reads 'not yet run (declared)'."""
  from experiments.sweeps import claims as claims_lib  # pylint: disable=import-outside-toplevel
  declared = [
      c for c in claims_lib.all_claims() if c.kind in ('confirmatory', 'check', 'descriptive')
  ]
  rows = verdicts.build(declared)
  committed = {
      r['claim']: r for r in verdicts.read_csv(os.path.join(verdicts.RESULTS_DIR, 'claims.csv'))
  }
  ran = [r for r in rows if r['n_seeds']]
  # The 17 confirmatory verdicts the audit of issue 54 recomputed, and every one run since.
  assert len([r for r in ran if r['kind'] == 'confirmatory']) >= 17
  for r in rows:
    c = committed[r['claim']]
    assert (r['n_seeds'], r['verdict']) == (c['n_seeds'], c['verdict']), r['claim']
    if r['n_seeds']:
      np.testing.assert_allclose([r['delta'], r['p_exact'], r['p_holm']],
                                 [c['delta'], c['p_exact'], c['p_holm']], rtol=1e-5,
                                 err_msg=r['claim'])
    else:
      assert r['verdict'] == 'not yet run (declared)', r['claim']
