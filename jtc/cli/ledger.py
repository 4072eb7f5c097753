r"""`jtc ledger` / `python -m jtc.ledger`: the per-token ledger of a run (`jtc.analysis.ledger`).

  python -m jtc.ledger steps  W                                     # steps with a ledger
  python -m jtc.ledger replay W --step N --objectives grpo,gspo,dfpo_min_replace [--contexts 4]
  python -m jtc.ledger html   W --step N --objectives grpo,gspo,dfpo_min_replace --out FILE.html
                              [--png FILE.png] [--group 0]

W is a run's workdir, or a population member's directory (W/members/<name>). `replay` prints, per
point and objective, the shared-token cancellation residual, the update's gradient norm, the KL
drift at shared contexts and the cosine between the objectives' updates, and writes
``W/ledger/N/replay.json``; for the run's own objective it also recomputes the step's loss and
grad_norm from the ledger and shows the logged ones beside them (`jtc.analysis.replay`). `html`
writes the viewer (`jtc.analysis.ledger_view`). Bad input (unknown objective, a step without a
ledger, a missing workdir, an objective the run cannot feed, an existing output) is one line
naming it, before anything is written.
"""

import argparse
import os

from jtc.analysis import ledger as ledger_lib
from jtc.analysis import ledger_view
from jtc.analysis import replay as replay_lib


def make_parser(prog='python -m jtc.ledger'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  steps = sub.add_parser('steps', help='the steps of W with a ledger')
  steps.add_argument('workdir')
  for name in ('replay', 'html'):
    p = sub.add_parser(name)
    p.add_argument('workdir')
    p.add_argument('--step', type=int, required=True)
    p.add_argument('--objectives', required=True, help='comma-separated loss names')
    p.add_argument('--contexts', type=int, default=4, help='shared contexts for the KL drift')
    if name == 'html':
      p.add_argument('--out', required=True)
      p.add_argument('--png', default=None, help='also a picture of one group')
      p.add_argument('--group', type=int, default=0)
      p.add_argument('--overwrite', action='store_true', help='replace existing --out / --png')
  return parser


def main(argv=None, prog='python -m jtc.ledger'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  if args.command == 'steps':
    if not os.path.isdir(args.workdir):
      parser.error(f'no such workdir {args.workdir!r}')
    print(' '.join(map(str, ledger_lib.steps(args.workdir))) or 'none')
    return 0
  names = [n for n in args.objectives.split(',') if n]
  try:
    ledger = replay_lib.open_for_replay(args.workdir, args.step, names)
    if args.command == 'html':
      ledger_view.check_outputs((args.out, args.png), overwrite=args.overwrite, group=args.group,
                                num_groups=len(ledger['advantages_B']) // ledger.meta['group_size'])
  except (ValueError, FileNotFoundError) as e:
    parser.error(str(e))
  replayed = replay_lib.replay(ledger, names, contexts=args.contexts)
  if args.command == 'replay':
    print('\n'.join(replay_lib.summary_lines(ledger, names, replayed)))
    print(replay_lib.write_replay(ledger, names, replayed))
  else:
    print('\n'.join(
        ledger_view.write(ledger, replayed, names, args.out, png_path=args.png, group=args.group)))
  return 0
