r"""`python -m jtc.ledger`: the per-token ledger of a run (`jtc.analysis.ledger`).

  python -m jtc.ledger steps  W                                     # steps with a ledger
  python -m jtc.ledger replay W --step N --objectives grpo,gspo,dfpo_min_replace [--contexts 4]
  python -m jtc.ledger html   W --step N --objectives grpo,gspo,dfpo_min_replace --out FILE.html
                              [--png FILE.png] [--group 0]

W is a run's workdir, or a population member's directory (W/members/<name>). `replay` prints, per
point and objective, the shared-token cancellation residual, the update's gradient norm, the KL
drift at shared contexts and the cosine between the objectives' updates, and writes
``W/ledger/N/replay.json``; for the run's own objective it also recomputes the step's loss and
grad_norm from the ledger and shows the logged ones beside them. `html` writes the viewer
(`jtc.analysis.ledger_view`). Bad input (unknown objective, a step without a ledger, a missing
workdir, an objective the run cannot feed) is one line naming it, before anything is written.
"""

import argparse
import json
import os
import sys

from jtc import files
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import ledger_view
from jtc.analysis import metric_writer
from jtc.analysis import replay as replay_lib


def _open(args, parser):
  """(ledger, objective names), or a parser error naming what is wrong."""
  if not os.path.isdir(args.workdir):
    parser.error(f'no such workdir {args.workdir!r}')
  members = metric_writer.run_dirs(args.workdir)
  if members != [args.workdir] and not ledger_lib.steps(args.workdir):
    parser.error(f'{args.workdir} is a population: pass one member\'s directory, e.g. '
                 f'{members[0]} ({len(members)} members)')
  try:
    ledger = ledger_lib.load(args.workdir, args.step)
    names = [n for n in args.objectives.split(',') if n]
    replay_lib.check_objectives(ledger, names)
  except (ValueError, FileNotFoundError) as e:
    parser.error(str(e))
  return ledger, names


def _print_replay(ledger, names, replayed):
  for point, result in replayed.items():
    print(f'[{point}] objective | shared-token residual | update grad norm | KL drift at '
          'shared contexts (measured / 1/2 eta^2 gFg)')
    for n in names:
      r = result['objectives'][n]
      drift = ', '.join(f'{d["kl"]:.2e}/{d["predicted"]:.2e}' for d in r['kl_drift'])
      res = 'n/a' if r['residual'] is None else f'{r["residual"]:.4f}'
      print(f'  {n:22s} | {res:>8s} | {r["grad_norm"]:.4e} | {drift}')
    print('  cosine between the updates: ' +
          '; '.join(f'{a}~{b} {result["cosine"][i][j]:+.3f}' for i, a in enumerate(names)
                    for j, b in enumerate(names) if j > i))
  logged = next((r for r in metric_writer.read_jsonl(
      os.path.join(os.path.dirname(os.path.dirname(ledger.path)), 'metrics.jsonl'))
                 if r.get('step') == ledger.meta['step']), {})
  again = replay_lib.reproduce(ledger)
  print(f'run objective {ledger.meta["loss"]}: loss {again["loss"]:.6g} (logged '
        f'{logged.get("loss", "n/a")}), grad_norm {again["grad_norm"]:.6g} (logged '
        f'{logged.get("grad_norm", "n/a")})')


def _check_outputs(args, parser, *, num_groups):
  """A parser error, before any compute, for an existing output (without --overwrite) or a
  group the step does not have."""
  for path in (args.out, args.png):
    if path and os.path.exists(path) and not args.overwrite:
      parser.error(f'{path} exists; pass --overwrite to replace it')
  if not 0 <= args.group < num_groups:
    parser.error(f'--group {args.group}: the step has groups 0..{num_groups - 1}')


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m jtc.ledger',
                                   description=__doc__.split('\n\n')[0])
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
  args = parser.parse_args(argv)
  if args.command == 'steps':
    if not os.path.isdir(args.workdir):
      parser.error(f'no such workdir {args.workdir!r}')
    print(' '.join(map(str, ledger_lib.steps(args.workdir))) or 'none')
    return 0
  ledger, names = _open(args, parser)
  if args.command == 'html':
    _check_outputs(args, parser,
                   num_groups=len(ledger['advantages_B']) // ledger.meta['group_size'])
  replayed = replay_lib.replay(ledger, names, contexts=args.contexts)
  if args.command == 'replay':
    _print_replay(ledger, names, replayed)
    path = os.path.join(ledger.path, 'replay.json')
    with open(path, 'w') as f:
      json.dump({'objectives': names, 'points': replayed}, f)
    print(path)
    return 0
  with open(args.out, 'w') as f:
    f.write(ledger_view.html(ledger, replayed, names))
  print(args.out)
  if args.png:
    print(ledger_view.png(ledger, replayed, names, args.png, group=args.group))
  return 0


if __name__ == '__main__':
  with files.report_damage():
    sys.exit(main())
