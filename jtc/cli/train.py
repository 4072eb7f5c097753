r"""`jtc train` / `python -m jtc.train`: the RL trainer's command (the trainer is `jtc.rl.trainer`).

  python -m jtc.train --config configs/<method>.py[:smoke|runlocal] --workdir W [--config.key=value]

The config file and its keys are checked before absl parses them (a typo gets one line naming
it and what is valid, not a traceback):
  * `--config=PATH[:arg]`: PATH may be relative to the working directory or to the repository
    (so `configs/gspo.py` works from any directory); a missing file, or a file that is not a
    method config (configs/common.py, configs/sft_arith.py, configs/real/base.py), is named.
  * `--config.a.b=value`: an unknown key is named with the nearest valid ones.
The errors a user can cause print one line; SIGINT / SIGTERM exit with 128 + the signal number
after a checkpoint (`jtc.rl.loop.StopOnSignal`).
"""

import glob
import importlib.util
import json
import os
import signal
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from jtc import checks
from jtc.cli import absl_program
from jtc.rl import checkpoints
from jtc.rl import distributed
from jtc.rl import trainer as trainer_lib
from jtc.rl import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _fail(message):
  sys.exit(f'error: {message}')


def _split_config_flag(argv):
  """(index, 'PATH[:arg]', prefix) of the --config value in argv, or (None, None, '')."""
  for i, a in enumerate(argv):
    if a.startswith('--config='):
      return i, a[len('--config='):], '--config='
    if a == '--config' and i + 1 < len(argv):
      return i + 1, argv[i + 1], ''
  return None, None, ''


def resolve_config_path(spec):
  """'PATH[:arg]' with PATH made absolute (working directory first, then the repository)."""
  path, sep, arg = spec.partition(':')
  for candidate in (path, os.path.join(REPO, path)):
    if os.path.isfile(candidate):
      path = os.path.abspath(candidate)
      break
  else:
    _fail(f'no such config file {path!r}; methods: {", ".join(methods())} '
          '(configs/<method>.py)')
  name = os.path.basename(path)
  if name in NOT_METHODS or name.startswith('sft_'):
    what = NOT_METHODS.get(name, 'an SFT config of `python -m jtc.sft`')
    _fail(f'{path} is {what}, not a method config; use one of {", ".join(methods())} '
          '(configs/<method>.py) or configs/real/*.py')
  return path + sep + arg


def _load(spec):
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_jtc_config', path)
  module = importlib.util.module_from_spec(module_spec)
  if REPO not in sys.path:
    sys.path.insert(0, REPO)  # method configs import `configs.common`
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def check_override_keys(config, argv):
  """Every --config.a.b=value names a key of the config, or one line naming it and the nearest."""
  keys = list(checks.flatten(config.to_dict()))
  for a in argv:
    if a.startswith('--config.'):
      key = a[len('--config.'):].partition('=')[0]
      if key not in keys and not any(k.startswith(key + '.') for k in keys):
        _fail(f'unknown config key config.{key}{checks.nearest(key, keys)} '
              '(every key is documented in configs/common.py)')


def parse_flags(argv, flag_values=flags.FLAGS):
  """absl flags parser for `app.run`: the checks above, then absl's own parsing (errors exit
  with one line)."""
  if '--help' not in argv and '-h' not in argv and '--helpfull' not in argv:
    i, spec, prefix = _split_config_flag(argv)
    if i is not None:
      spec = resolve_config_path(spec)
      argv = list(argv)
      argv[i] = prefix + spec
      try:
        config = _load(spec)
      except ValueError as e:  # e.g. an unknown ':arg'
        _fail(str(e))
      check_override_keys(config, argv)
  try:
    return flag_values(argv)
  except flags.Error as e:
    _fail(f'{e}\nRun with --help for the flags; every config key is documented in '
          'configs/common.py')


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
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # orbax and tfds are chatty at INFO
  try:
    distributed.initialize()  # several processes: before any other JAX work
    distributed.check_agreement(json.loads(flags.FLAGS.config.to_json_best_effort()))
    trainer = trainer_lib.Trainer(flags.FLAGS.config, flags.FLAGS.workdir,
                                  allow_config_change=flags.FLAGS.allow_config_change)
  except (ValueError, workdir_lib.WorkdirError, checkpoints.CheckpointMismatch,
          distributed.DistributedError) as e:
    _fail(str(e))
  last, stopped = trainer.run()
  _print_last(trainer, last)
  if stopped:
    sys.exit(128 + signal.Signals[stopped].value)


def main(argv=None, prog='python -m jtc.train'):
  """The command: ``argv`` without the program name (None: the process's)."""
  absl_program.run(train, argv, prog=prog, define_flags=define_flags, flags_parser=parse_flags)
