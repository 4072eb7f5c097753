r"""`jtc sft` / `python -m jtc.sft`: supervised fine-tuning of the base policies (`jtc.rl.sft_trainer`).

  python -m jtc.sft --config configs/sft_arith.py --workdir W
"""

import json
import os

from absl import flags
from ml_collections import config_flags

from jtc.cli import absl_program
from jtc.rl import distributed
from jtc.rl import sft_trainer


def define_flags(flag_values, argv=None):
  """The command's flags, in ``flag_values``, for the command line ``argv`` (program name
  first; None: the process's), whose --config.* overrides the config flag takes; returns the
  flags' names."""
  config_flags.DEFINE_config_file('config', None, 'SFT config file.', lock_config=True,
                                  flag_values=flag_values, sys_argv=argv)
  flags.DEFINE_string('workdir', None, 'Where the policy bundle and metrics go.',
                      flag_values=flag_values)
  flags.mark_flags_as_required(['config', 'workdir'], flag_values=flag_values)
  return ['config', 'workdir']


def run(argv):
  """`sft_trainer.train_sft` from the parsed flags; prints the final evaluation."""
  try:
    absl_program.start(argv)
  except distributed.DistributedError as e:
    absl_program.fail(str(e))
  os.makedirs(flags.FLAGS.workdir, exist_ok=True)
  with distributed.exit_when_a_peer_is_lost():
    result = sft_trainer.train_sft(flags.FLAGS.config, flags.FLAGS.workdir)
  if distributed.is_primary():
    print(json.dumps(result))


def main(argv=None, prog='python -m jtc.sft'):
  """The command: ``argv`` without the program name (None: the process's)."""
  absl_program.run(run, argv, prog=prog, define_flags=define_flags)
