"""The verifier comparison (benchmarks/verifiers.py): its hand-labelled cases are well formed,
and its agreement table and disagreement list count what they claim (hand-made verdicts)."""
import collections

import numpy as np

from benchmarks import verifier_cases
from benchmarks import verifiers as bench
from jtc.data import rewards


def test_the_cases_are_at_least_200_distinct_labelled_pairs_with_both_verdicts():
  cases = verifier_cases.CASES
  assert len(cases) >= 200
  assert len({(c, a) for _, c, a, _ in cases}) == len(cases)
  assert all(
      label in (0, 1) and isinstance(c, str) and isinstance(a, str) for _, c, a, label in cases)
  labels = collections.Counter(label for *_, label in cases)
  assert labels[0] >= 50 and labels[1] >= 50  # known negatives as well as positives
  assert len({cat for cat, *_ in cases}) >= 15


def test_agreement_rows_count_matches_per_category_and_overall():
  verdicts = {
      'hand': np.array([1, 0, 1, 1]),
      'x': np.array([1, 0, 0, 1]),
      'y': np.array([0, 0, 0, 1]),
  }
  pairs, rows = bench.agreement_rows(['a', 'a', 'b', 'b'], verdicts)
  assert pairs == [('hand', 'x'), ('hand', 'y'), ('x', 'y')]
  assert rows == [['a', 2, 1.0, 0.5, 0.5], ['b', 2, 0.5, 0.5, 1.0], ['all', 4, 0.75, 0.5, 0.75]]
  assert bench.disagreements(verdicts) == [0, 2]


def test_the_report_lists_every_disagreement_of_boxed_numeric_with_the_hand_label():
  cases = verifier_cases.CASES
  verdicts = {'hand': np.asarray([c[3] for c in cases], np.float32)}
  verdicts['boxed_numeric'] = rewards.boxed_numeric([''] * len(cases), [c[1] for c in cases],
                                                    [c[2] for c in cases])
  verdicts['math_verify'] = verdicts['hand']  # stands in for the pool here
  text = bench.markdown(cases, verdicts, pathological=[])
  wrong = int((verdicts['boxed_numeric'] != verdicts['hand']).sum())
  assert 0 < wrong < len(cases)
  assert f'boxed_numeric: {wrong} of {len(cases)}' in text
  assert f'math_verify: 0 of {len(cases)}' in text
  listed = text.split('Every pair')[1].count('\n| ') - 1  # less the header row
  assert listed == wrong
