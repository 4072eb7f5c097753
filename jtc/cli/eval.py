r"""`jtc eval`: a checkpoint's avg@k and pass@k on a dataset, per data source
(`jtc.rl.checkpoint_eval`).

  jtc eval --checkpoint /ckpt/Qwen3-0.6B --dataset gsm8k/ --k 8
  jtc eval --checkpoint base --dataset arithmetic --config configs/gspo.py

--checkpoint is a Hugging Face directory or a jtc policy bundle ('base', 'phrasing', a
`jtc sft` workdir's policy/); --dataset a dataset path (its `test` split, or its only split) or
a task name. The decoding, verifier and prompt settings are --config's `eval` and `data` sections
(default: configs/real/base.py for a Hugging Face checkpoint, the real configs' evaluation:
temperature 0.6, top-p 0.95, top-k 20, `\boxed{}` answers; configs/common.py for a jtc bundle),
each overridable as --config.<section>.<key>=value. It prints one JSON line (and writes it to
--out).
"""

import argparse
import json
import os
import sys

from jtc.cli import absl_program
from jtc.data import tasks as tasks_lib


class OverridesParser(argparse.ArgumentParser):
  """argparse that also takes --config.<section>.<key>=value overrides (``args.overrides``)."""

  def parse_args(self, args=None, namespace=None):  # pylint: disable=arguments-differ
    args, rest = self.parse_known_args(args, namespace)
    bad = [a for a in rest if not (a.startswith('--config.') and '=' in a)]
    if bad:
      self.error(f'unrecognized arguments: {" ".join(bad)}')
    args.overrides = rest
    return args


def make_parser(prog='jtc eval'):
  parser = OverridesParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('--checkpoint', required=True,
                      help='a Hugging Face directory or a jtc policy bundle')
  parser.add_argument('--dataset', required=True, help='a dataset path or a task name')
  parser.add_argument('--config', default=None, help='whose data / eval sections apply')
  parser.add_argument('--k', type=int, default=None,
                      help='samples per problem (config.eval.sampling.num_samples)')
  parser.add_argument('--problems', type=int, default=None, help='config.eval.problems')
  parser.add_argument('--max-new-tokens', type=int, default=None,
                      help='config.eval.sampling.max_new_tokens')
  parser.add_argument('--out', default=None, help='also write the JSON result here')
  return parser


def _value(old, text):
  if isinstance(old, bool):
    if text.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(f'{text!r} is not a boolean')
    return text.lower() in ('true', '1')
  return type(old)(text) if old is not None else text


def load_with_overrides(spec, overrides):
  """The config file ``spec`` ('PATH[:arg]', from the working directory or the repository) with
  its --config.<section>.<key>=value ``overrides``; ValueError naming a bad one."""
  spec = absl_program.resolve_path(spec)
  if not os.path.isfile(spec.partition(':')[0]):
    raise ValueError(f'no such config file {spec!r}')
  c = absl_program.load_config(spec)
  absl_program.check_override_keys(c, overrides)
  with c.unlocked():
    for override in overrides:
      key, _, text = override[len('--config.'):].partition('=')
      *parents, leaf = key.split('.')
      node = c
      for part in parents:
        node = node[part]
      node[leaf] = _value(node[leaf], text)
  return c


def build_config(args):
  """The config of an evaluation: --config (or its default), the checkpoint and dataset, the
  flags and the overrides; ValueError naming a bad one."""
  hf = os.path.isfile(os.path.join(args.checkpoint, 'config.json'))
  default = os.path.join(absl_program.REPO, 'configs', 'real' if hf else '',
                         'base.py' if hf else 'common.py')
  c = load_with_overrides(args.config or default, args.overrides)
  with c.unlocked():
    c.policy.checkpoint, c.policy.init = (args.checkpoint, '') if hf else ('', args.checkpoint)
    is_task = args.dataset in tasks_lib.TASKS and not os.path.exists(args.dataset)
    c.data.task, c.data.dataset = (args.dataset, '') if is_task else ('', args.dataset)
    c.data.eval_dataset = ''
    for name, key in (('k', 'num_samples'), ('max_new_tokens', 'max_new_tokens')):
      if getattr(args, name) is not None:
        c.eval.sampling[key] = getattr(args, name)
    if args.problems is not None:
      c.eval.problems = args.problems
  return c


def main(argv=None, prog='jtc eval'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  from jtc.rl import checkpoint_eval  # pylint: disable=import-outside-toplevel
  from jtc.rl import config_check  # pylint: disable=import-outside-toplevel
  try:
    c = build_config(args)
    config_check.checkpoints.check_policy_config(c.policy)
    config_check.data_lib.check_config(c.data, tasks=tasks_lib.TASKS,
                                       reward_fns=config_check.rewards_lib.reward_names())
    config_check.verifiers.check_config(c.data)
    result = checkpoint_eval.evaluate_checkpoint(c)
  except (ValueError, KeyError) as e:
    parser.error(str(e))
  line = json.dumps({'checkpoint': args.checkpoint, 'dataset': args.dataset, **result})
  print(line)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(line + '\n')
  sys.stdout.flush()
  return 0
