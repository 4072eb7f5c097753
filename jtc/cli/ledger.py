r"""`jtc ledger` / `python -m jtc.ledger`: the per-token ledger of a run (`jtc.analysis.ledger`).

  python -m jtc.ledger steps  W                                     # steps with a ledger
  python -m jtc.ledger replay W --step N --objectives grpo,gspo,dfpo_min_replace [--contexts 4]
  python -m jtc.ledger html   W --step N --objectives grpo,gspo,dfpo_min_replace --out FILE.html
                              [--png FILE.png] [--group 0]
  python -m jtc.ledger import --from {prime-rl,slime,verl,jsonl} PATH --out W
                              [--policy.checkpoint HF_DIR] [--objectives a,b] [--hparams k=v,...]

W is a run's workdir, or a population member's directory (W/members/<name>). `replay` prints, per
point and objective, the shared-token cancellation residual, the update's gradient norm, the KL
drift at shared contexts and the cosine between the objectives' updates, and writes
``W/ledger/N/replay.json``; for the run's own objective it also recomputes the step's loss and
grad_norm from the ledger and shows the logged ones beside them (`jtc.analysis.replay`). `html`
writes the viewer (`jtc.analysis.ledger_view`). `import` turns another framework's dumped
rollouts into a ledger step W/ledger/<step>/ that the other subcommands open, and replays the
``--objectives`` on it (`jtc.interop.ledger_import`; the formats: docs/ledger.md). Bad input (unknown objective, a step without a
ledger, a missing workdir, an objective the run cannot feed, an existing output) is one line
naming it, before anything is written.
"""

import argparse
import os
import sys

from jtc import checks

from jtc.analysis import ledger as ledger_lib
from jtc.analysis import ledger_view
from jtc.analysis import replay as replay_lib

# What `steps` says of a run without a ledger: the key that records one.
NO_LEDGER = ('none: this run recorded no ledger; train with --config.log.ledger_every=N to record '
             'one every N steps (docs/ledger.md)')


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
  _import_parser(sub)
  return parser


def _import_parser(sub):
  p = sub.add_parser('import', help='another framework\'s dumped rollouts as a ledger')
  p.add_argument('--from', dest='fmt', required=True, help='prime-rl | slime | verl | jsonl')
  p.add_argument(
      'path', help='the dump: a prime-rl step_<n> directory or rank file, a slime '
      '.pt file, a verl <step>.jsonl, a neutral-schema .jsonl')
  p.add_argument('--out', required=True, help='a directory; the ledger goes to OUT/ledger/<step>')
  p.add_argument('--policy.checkpoint', dest='checkpoint', default=None,
                 help='the run\'s HF checkpoint: log pi recomputed, the policy kept for replay')
  p.add_argument(
      '--tokenizer', default=None, help='an HF directory with tokenizer.json '
      '(default: the checkpoint\'s); verl dumps text and need one')
  p.add_argument('--objectives', default=None,
                 help='comma-separated; the first is the run\'s objective (default by format)')
  p.add_argument('--hparams', default='', help='the run objective\'s hyper-parameters k=v,...')
  p.add_argument('--advantage', default='grpo', help='from the rewards when the dump has none: '
                 'grpo | dr_grpo | rloo')
  p.add_argument('--reward-key', default=None, help='slime: the key of a dict reward')
  p.add_argument('--step', type=int, default=None, help='jsonl: the step of a multi-step file')
  p.add_argument('--framework-hparams', default='',
                 help='prime-rl: adv_tau=1.0,kl_tau=0.001 (its loss\'s, not exported)')
  p.add_argument('--overwrite', action='store_true', help='replace OUT/ledger/<step>')


def _fail(prog, message):
  """A command's bad input: one line, no traceback, exit status 2."""
  print(f'{prog}: error: {message}', file=sys.stderr)
  sys.exit(2)


def run_import(args, prog):
  """`import`: read, lay out, write the ledger step, replay the objectives; returns 0."""
  from jtc.interop import ledger_import  # pylint: disable=import-outside-toplevel
  prog = f'{prog} import'
  try:
    names = [
        n for n in (args.objectives or ledger_import.DEFAULT_OBJECTIVE.get(args.fmt, '')).split(',')
        if n
    ]
    hparams = checks.assignments('--hparams', args.hparams)
    ledger_import.check_request(args.fmt, names, hparams, advantage=args.advantage)
    tokenizer = ledger_import.load_tokenizer(args.tokenizer or args.checkpoint)
    rollouts, source = ledger_import.read_dump(
        args.fmt, args.path, tokenizer=tokenizer, step=args.step, advantage=args.advantage,
        reward_key=args.reward_key,
        framework_hparams=checks.assignments('--framework-hparams', args.framework_hparams))
    source['path'] = os.path.abspath(args.path)
    columns, meta, model = ledger_import.build(rollouts, source, objective=names[0],
                                               hparams=hparams, checkpoint=args.checkpoint,
                                               tokenizer=tokenizer)
    path = ledger_import.write(args.out, columns, meta, model, overwrite=args.overwrite)
  except (ValueError, OSError) as e:
    _fail(prog, str(e))
  print(ledger_import.summary(meta, columns))
  ledger = ledger_lib.load(args.out, meta['step'])
  replayed = replay_lib.replay(ledger, names)
  print('\n'.join(replay_lib.summary_lines(ledger, names, replayed)))
  replay_lib.write_replay(ledger, names, replayed)
  print(path)
  return 0


def main(argv=None, prog='python -m jtc.ledger'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  if args.command == 'import':
    return run_import(args, prog)
  if args.command == 'steps':
    if not os.path.isdir(args.workdir):
      parser.error(f'no such workdir {args.workdir!r}')
    print(' '.join(map(str, ledger_lib.steps(args.workdir))) or NO_LEDGER)
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
