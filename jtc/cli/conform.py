r"""`jtc conform`: checks anyone's RL loss against jtc's per-token coefficients (`jtc.interop.conform`).

  jtc conform --loss MODULE:FUNCTION --objective NAME --aggregation AGG
              [--framework torch|jax|numpy] [--hparams k=v,...] [--accumulation mean|sum]
              [--tolerance 1e-4] [--seed 0] [--save FILE.npz]

The function is ``fn(logp, old_logp, advantages, mask, **hparams) -> scalar loss`` (``logp``
[B, T] differentiable; the context keywords it may take: `jtc.interop.conform_grad`); adapters for
verl's, TRL's and prime-rl's loss signatures are in `jtc.interop.conform_adapters`. It prints one
line per check and exits 0 only when every check passes (1 otherwise); the first failing batch is
saved to --save (a new temporary file when not given). Bad input (a loss that does not import or
returns a non-scalar, an unknown objective, aggregation or framework) is one line naming it, exit
status 2, nothing written.
"""

import argparse
import os
import sys

from jtc import checks


def make_parser(prog='jtc conform'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('--loss', required=True, help='MODULE:FUNCTION of the loss to check')
  parser.add_argument('--objective', required=True, help='the jtc objective it implements')
  parser.add_argument(
      '--aggregation', required=True,
      help='token_mean | seq_mean_token_mean | seq_mean_token_sum | '
      'seq_mean_token_sum_norm')
  parser.add_argument('--framework', default='torch', help='torch | jax | numpy')
  parser.add_argument(
      '--hparams', default='', help='k=v,... given to the function (and to '
      'jtc\'s closed form where the objective has the key)')
  parser.add_argument('--accumulation', default='mean',
                      help='how micro-batch losses add up: mean (averaged) | sum')
  parser.add_argument('--tolerance', type=float, default=None, help='relative, default 1e-4')
  parser.add_argument('--seed', type=int, default=0, help='the batches\' seed')
  parser.add_argument('--save', default=None, help='where the first failing batch goes (npz)')
  parser.add_argument('--overwrite', action='store_true', help='replace an existing --save')
  return parser


def _fail(prog, message):
  print(f'{prog}: error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv=None, prog='jtc conform'):
  """The command: ``argv`` without the program name; returns 0 when every check passes, 1 not."""
  from jtc.interop import conform  # pylint: disable=import-outside-toplevel
  from jtc.interop import conform_grad  # pylint: disable=import-outside-toplevel
  args = make_parser(prog).parse_args(argv)
  tol = conform.TOLERANCE if args.tolerance is None else args.tolerance
  try:
    hparams = checks.assignments('--hparams', args.hparams)
    if not tol > 0:
      raise ValueError(f'--tolerance {tol!r} must be > 0')
    if args.save and os.path.exists(args.save) and not args.overwrite:
      raise ValueError(f'{args.save} exists; pass --overwrite to replace it')
    conform.check_request(args.objective, args.aggregation, hparams, args.framework,
                          args.accumulation)
    fn = conform_grad.load(args.loss)
    result = conform.run(fn, name=args.loss, objective=args.objective, aggregation=args.aggregation,
                         hparams=hparams, framework=args.framework, accumulation=args.accumulation,
                         tol=tol, seed=args.seed, save=args.save)
  except (ValueError, OSError) as e:  # LossError is a ValueError
    _fail(prog, str(e))
  print('\n'.join(
      conform.report(result, name=args.loss, objective=args.objective, aggregation=args.aggregation,
                     hparams=hparams, framework=args.framework, accumulation=args.accumulation,
                     tol=tol)))
  return 0 if result.passed else 1
