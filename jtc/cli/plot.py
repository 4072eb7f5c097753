r"""`jtc plot` / `python -m jtc.plot`: training curves of runs (`jtc.analysis.curve_plots`).

  python -m jtc.plot W1 [W2 ...] --out curves.png [--keys reward_mean,eval/avg@4] [--smooth 10]

A W that is a population's workdir stands for its members; DelTA runs' token clouds go to
`<out>_tokens.png`. A key no run logs is an error listing the keys the runs have.
"""

import argparse

from jtc.analysis import curve_plots


def make_parser(prog='python -m jtc.plot'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('workdirs', nargs='+')
  parser.add_argument('--out', default='curves.png')
  parser.add_argument(
      '--keys', default=None, help='comma-separated metric keys (default: held-out accuracy and '
      f'those of {",".join(curve_plots.DEFAULT_KEYS)} that the runs log)')
  parser.add_argument('--smooth', type=int, default=1,
                      help='trailing-mean window in logged points (default 1: no smoothing)')
  return parser


def main(argv=None, prog='python -m jtc.plot'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  keys = None if args.keys is None else [k.strip() for k in args.keys.split(',') if k.strip()]
  try:
    paths = curve_plots.plot_workdirs(args.workdirs, args.out, keys, smooth=args.smooth)
  except (ValueError, FileNotFoundError) as e:
    parser.error(str(e))
  print('\n'.join(paths))
  return 0
