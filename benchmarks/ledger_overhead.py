r"""What the per-token ledger costs: RL steps of the default config with `log.ledger_every = k`
against the same steps without it, interleaved in blocks of k steps.

  python -m benchmarks.ledger_overhead [--every 10] [--blocks 4]

Two trainers of configs/dfpo_min_replace.py (the shipped base policy), one with the ledger every
k steps, one without, take the same steps; after k warm-up steps each (every function compiled,
the ledger's too), blocks of k steps alternate between them, each block timed whole (so it holds
exactly one ledger step), with the cores other processes used meanwhile and the load average
printed beside it. The overhead is the ratio of the summed block times minus 1 (aim: < 10% at
k = 10).
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trainer(workdir, every):
  sys.path.insert(0, REPO)
  from configs import dfpo_min_replace  # pylint: disable=import-outside-toplevel
  from jtc.rl import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  c = dfpo_min_replace.get_config()
  c.log.ledger_every, c.log.diagnostics_every, c.eval.every = every, 0, 0
  return trainer_lib.Trainer(c, workdir)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--every', type=int, default=10)
  parser.add_argument('--blocks', type=int, default=4)
  args = parser.parse_args()
  print(harness.device_line())
  k = args.every
  with tempfile.TemporaryDirectory() as root:
    trainers = {
        'ledger': _trainer(os.path.join(root, 'on'), k),
        'plain': _trainer(os.path.join(root, 'off'), 0)
    }
    for t in trainers.values():  # warm-up: compiles everything, one ledger step included
      for step in range(1, k + 1):
        t.step(step)
    total = {name: 0.0 for name in trainers}
    loaded = False
    for b in range(args.blocks):
      steps = range(k * (b + 1) + 1, k * (b + 2) + 1)
      for name in (('ledger', 'plain') if b % 2 == 0 else ('plain', 'ledger')):
        with harness.OtherLoad() as other:
          for step in steps:
            trainers[name].step(step)
        total[name] += other.seconds
        loaded |= harness.is_loaded(other)
        print(
            f'block {b + 1} {name:6s}: {other.seconds / k * 1e3:7.1f} ms per step '
            f'({harness.load_str(other)})', flush=True)
    for t in trainers.values():
      t.close()
  ratio = total['ledger'] / total['plain']
  print(f'ledger every {k} steps: {100 * (ratio - 1):+.1f}% step time ({ratio:.3f}x)' +
        ('  (LOADED: other processes competed; not a valid ratio)' if loaded else ''))


if __name__ == '__main__':
  main()
