r"""`jtc train` / `python -m jtc.train`: the RL trainer's command (the trainer is `jtc.rl.trainer`).

  python -m jtc.train --config configs/<method>.py[:smoke|runlocal] --workdir W [--config.key=value]

The config file and its keys are checked before absl parses them (a typo gets one line naming
it and what is valid, not a traceback; `jtc.cli.absl_program`):
  * `--config=PATH[:arg]`: PATH may be relative to the working directory or to the repository
    (so `configs/gspo.py` works from any directory); a missing file, or a file that is not a
    method config (configs/common.py, configs/sft_arith.py, configs/real/base.py), is named.
  * `--config.a.b=value`: an unknown key is named with the nearest valid ones.
The errors a user can cause print one line; SIGINT / SIGTERM exit with 128 + the signal number
after a checkpoint (`jtc.rl.progress.StopOnSignal`).
"""

import glob
import json
import os
import signal
import sys

from absl import flags
from ml_collections import config_flags

from jtc.cli import absl_program
from jtc.rl import checkpoints
from jtc.rl import distributed
from jtc.rl import trainer as trainer_lib
from jtc.rl import workdir as workdir_lib

REPO = absl_program.REPO
NOT_METHODS = {
    'common.py': 'the defaults every method config shares',
    'base.py': 'the settings the real-model configs share'
}


def methods():
  """The method configs: configs/<name>.py (not common.py, __init__.py or the sft_*.py)."""
  return sorted(
      os.path.basename(p)[:-3]
      for p in glob.glob(os.path.join(REPO, 'configs', '*.py'))
      if os.path.basename(p) not in ('__init__.py',
                                     *NOT_METHODS) and not os.path.basename(p).startswith('sft_'))


def define_flags(flag_values, argv=None):
  """The command's flags, in ``flag_values``, for the command line ``argv`` (program name
  first; None: the process's), whose --config.* overrides the config flag takes; returns the
  flags' names."""
  config_flags.DEFINE_config_file(
      'config', None, 'Training config: configs/<method>.py[:smoke|runlocal] with methods '
      f'{", ".join(methods())}, or configs/real/*.py; override any key with '
      '--config.<section>.<key>=value (every key is documented in configs/common.py).',
      lock_config=True, flag_values=flag_values, sys_argv=argv)
  flags.DEFINE_string(
      'workdir', None, 'Where checkpoints, config.json and metrics.jsonl go; '
      'a workdir holding a run of the same config resumes it.', flag_values=flag_values)
  flags.DEFINE_bool(
      'allow_config_change', False, 'Resume a workdir whose run was made with '
      'another config (the differing keys are listed when this is refused).',
      flag_values=flag_values)
  flags.mark_flags_as_required(['config', 'workdir'], flag_values=flag_values)
  return ['config', 'workdir', 'allow_config_change']


def resolve_config_path(spec):
  """'PATH[:arg]' with PATH made absolute (working directory first, then the repository), or
  one line naming a missing file or a file that is not a method config."""
  spec = absl_program.resolve_path(spec)
  path, sep, arg = spec.partition(':')
  if not os.path.isfile(path):
    absl_program.fail(f'no such config file {path!r}; methods: {", ".join(methods())} '
                      '(configs/<method>.py)')
  name = os.path.basename(path)
  if name in NOT_METHODS or name.startswith('sft_'):
    what = NOT_METHODS.get(name, 'an SFT config of `python -m jtc.sft`')
    absl_program.fail(f'{path} is {what}, not a method config; use one of {", ".join(methods())} '
                      '(configs/<method>.py) or configs/real/*.py')
  return path + sep + arg


def parse_flags(argv, flag_values=flags.FLAGS):
  """absl flags parser for `app.run`: a method config's path resolved (`resolve_config_path`),
  then `absl_program.parse_flags`."""
  return absl_program.parse_flags(argv, flag_values, resolve=resolve_config_path)


def _print_last(trainer, last):
  """One JSON line per member: its last step, reward, accuracy and evaluation."""
  for path, record in zip(trainer.member_dirs if trainer.primary else [], last):
    shown = {
        k: v for k, v in record.items() if 'eval' in k or k in ('step', 'reward_mean', 'accuracy')
    }
    if len(last) > 1:
      shown = {'member': os.path.relpath(path, trainer.workdir), **shown}
    print(json.dumps(shown))


def train(argv):
  """``Trainer(config, workdir).run()`` from the parsed flags."""
  try:
    absl_program.start(argv)
    trainer = trainer_lib.Trainer(flags.FLAGS.config, flags.FLAGS.workdir,
                                  allow_config_change=flags.FLAGS.allow_config_change)
  except (ValueError, workdir_lib.WorkdirError, checkpoints.CheckpointMismatch,
          distributed.DistributedError) as e:
    absl_program.fail(str(e))
  with distributed.exit_when_a_peer_is_lost():
    last, stopped = trainer.run()
  _print_last(trainer, last)
  if stopped:
    sys.exit(128 + signal.Signals[stopped].value)


def main(argv=None, prog='python -m jtc.train'):
  """The command: ``argv`` without the program name (None: the process's)."""
  absl_program.run(train, argv, prog=prog, define_flags=define_flags, flags_parser=parse_flags)
