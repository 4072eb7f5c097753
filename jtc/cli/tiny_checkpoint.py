r"""`jtc tiny-checkpoint`: a random tiny Hugging Face checkpoint with a tokenizer, for smoke runs
(`jtc.models.tiny_checkpoint`).

  jtc tiny-checkpoint /tmp/tiny --like qwen3
  jtc train --config configs/real/qwen3_0_6b_gsm8k_dfpo.py:smoke --workdir /tmp/jtc/smoke \
    --config.policy.checkpoint=/tmp/tiny --config.data.dataset=gsm8k/

An OUT that exists and is not empty is refused (nothing is overwritten).
"""

import argparse
import os

from jtc.models import tiny_checkpoint


def make_parser(prog='jtc tiny-checkpoint'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('out', help='the directory to write (created; must not hold files)')
  parser.add_argument('--like', default='qwen3', choices=sorted(tiny_checkpoint.LIKE),
                      help='the architecture (default qwen3)')
  parser.add_argument('--seed', type=int, default=0, help='of the random weights')
  return parser


def main(argv=None, prog='jtc tiny-checkpoint'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
    parser.error(f'{args.out} exists and is not an empty directory; nothing was written')
  config = tiny_checkpoint.write(args.out, like=args.like, seed=args.seed)
  print(f'wrote a random {args.like} checkpoint ({config.n_layers} layers, d_model '
        f'{config.d_model}, vocabulary {config.vocab_size}) and its tokenizer to {args.out}')
  return 0
