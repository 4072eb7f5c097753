r"""`jtc export`: a run's trained policy as a Hugging Face directory (`jtc.rl.export`).

  jtc export /tmp/jtc/gspo /tmp/jtc/gspo_hf
  jtc export /tmp/jtc/pop /tmp/jtc/pop_member3 --member 3

WORKDIR is a `jtc train` workdir; OUT gets config.json, model.safetensors and the tokenizer
(loads with transformers' AutoModelForCausalLM and as --config.policy.checkpoint). An OUT that
holds files is refused.
"""

import argparse

from jtc.rl import export


def make_parser(prog='jtc export'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('workdir', help='the workdir of a jtc train run')
  parser.add_argument('out', help='the Hugging Face directory to write')
  parser.add_argument('--member', type=int, default=None,
                      help="a population's member to export (0-based)")
  return parser


def main(argv=None, prog='jtc export'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  try:
    step = export.export(args.workdir, args.out, member=args.member)
  except ValueError as e:
    parser.error(str(e))
  print(f'wrote the policy of step {step} of {args.workdir} to {args.out}')
  return 0
