"""boxed_numeric vs math_verify vs a hand label on 230 (completion, reference) pairs.

Run (prints the markdown of docs/verifiers.md's tables; a minute on 2 cores):
  python -m benchmarks.verifiers

The pairs and how they were labelled: benchmarks/verifier_cases.py. For each category the table
gives how often each verifier agrees with the hand label and with the other verifier; then every
pair where any two of the three differ, with what each said. math_verify runs as the trainer
runs it (`jtc.data.math_verifier.MathVerifyReward`: a pool of worker processes with a per-answer
timeout). Last, answers that hang Math-Verify without a timeout: how long the pool took to score
each (0 expected) against its timeout.
"""

import argparse
import collections
import time

import numpy as np

from benchmarks import verifier_cases
from jtc.data import math_verifier
from jtc.data import rewards

VERIFIERS = ('boxed_numeric', 'math_verify')


def agreement_rows(categories, verdicts):
  """Per category (in first-seen order) and 'all': [name, n, then for each pair of
  ``verdicts`` keys (in order) the fraction of cases where the two agree].

  ``verdicts``: name -> [N] 0/1 array (e.g. 'hand', 'boxed_numeric', 'math_verify')."""
  names = list(verdicts)
  pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
  groups = collections.OrderedDict()
  for i, cat in enumerate(categories):
    groups.setdefault(cat, []).append(i)
  groups['all'] = list(range(len(categories)))
  rows = []
  for cat, idx in groups.items():
    agree = [float(np.mean(verdicts[a][idx] == verdicts[b][idx])) for a, b in pairs]
    rows.append([cat, len(idx), *agree])
  return pairs, rows


def disagreements(verdicts):
  """Indices of the cases on which the ``verdicts`` (name -> [N] array) are not all equal."""
  stacked = np.stack(list(verdicts.values()))
  return [int(i) for i in np.flatnonzero((stacked != stacked[0]).any(0))]


def _cell(text):
  """A markdown table cell showing ``text`` exactly (code span; newlines as \\n, | escaped)."""
  return '`' + text.replace('\n', '\\n').replace('|', '\\|') + '`' if text else '(empty)'


def markdown(cases, verdicts, pathological):
  """The report: agreement table, the disagreements, the pathological answers' times."""
  pairs, rows = agreement_rows([c[0] for c in cases], verdicts)
  out = ['| category | n | ' + ' | '.join(f'{a} = {b}' for a, b in pairs) + ' |']
  out.append('|---|---:|' + '---:|' * len(pairs))
  for cat, n, *agree in rows:
    name = f'**{cat}**' if cat == 'all' else cat
    out.append(f'| {name} | {n} | ' + ' | '.join(f'{a:.1%}' for a in agree) + ' |')
  wrong = {v: int((verdicts[v] != verdicts['hand']).sum()) for v in VERIFIERS}
  out.append('')
  out.append(', '.join(
      f'{v}: {wrong[v]} of {len(cases)} against the hand label' for v in VERIFIERS))
  out.append('')
  out.append('Every pair where the three verdicts are not all equal (1 = correct):')
  out.append('')
  out.append('| category | completion | reference | hand | boxed_numeric | math_verify |')
  out.append('|---|---|---|---:|---:|---:|')
  for i in disagreements(verdicts):
    cat, completion, reference, _ = cases[i]
    said = ' | '.join(str(int(verdicts[k][i])) for k in ('hand', *VERIFIERS))
    out.append(f'| {cat} | {_cell(completion)} | {_cell(reference)} | {said} |')
  if pathological:
    out.append('')
    out.append('Answers that hang Math-Verify without a timeout (reference `5`):')
    out.append('')
    out.append('| completion | score | seconds blocked | timeout |')
    out.append('|---|---:|---:|---:|')
    for completion, score, seconds, timeout in pathological:
      out.append(f'| {_cell(completion)} | {score:g} | {seconds:.2f} | {timeout:g} |')
  return '\n'.join(out)


def run_pathological(reward, answers):
  """(completion, score, seconds, timeout) of each answer scored alone against '5'; a worker
  is ready for each (a timed-out one's replacement has started) before its clock starts."""
  out = []
  for completion in answers:
    reward([''], ['\\boxed{5}'], ['5'])  # waits for a ready worker
    start = time.monotonic()
    score = float(reward([''], [completion], ['5'])[0])
    out.append((completion, score, time.monotonic() - start, reward.pool.timeout_s))
  return out


def make_parser():
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--workers', type=int, default=2, help='math_verify worker processes')
  parser.add_argument('--timeout_s', type=float, default=10.0, help='per-answer timeout')
  parser.add_argument('--skip_pathological', action='store_true',
                      help='leave out the answers that hang Math-Verify')
  return parser


def main():
  args = make_parser().parse_args()
  cases = verifier_cases.CASES
  prompts, completions = [''] * len(cases), [c[1] for c in cases]
  answers = [c[2] for c in cases]
  verdicts = {'hand': np.asarray([c[3] for c in cases], np.float32)}
  start = time.perf_counter()
  verdicts['boxed_numeric'] = rewards.boxed_numeric(prompts, completions, answers)
  seconds = {'boxed_numeric': time.perf_counter() - start}
  with math_verifier.MathVerifyReward(workers=args.workers, timeout_s=args.timeout_s) as reward:
    start = time.perf_counter()
    verdicts['math_verify'] = reward(prompts, completions, answers)
    seconds['math_verify'] = time.perf_counter() - start
    timeouts = reward.pool.timeouts
    pathological = [] if args.skip_pathological else run_pathological(reward,
                                                                      verifier_cases.PATHOLOGICAL)
  print(markdown(cases, verdicts, pathological))
  print(f'\nTime for the {len(cases)} pairs: boxed_numeric {seconds["boxed_numeric"]:.3f} s '
        f'(in-process), math_verify {seconds["math_verify"]:.2f} s ({args.workers} workers, '
        f'{timeouts} timeouts at {args.timeout_s:g} s).')


if __name__ == '__main__':
  main()
