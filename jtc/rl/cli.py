"""The trainer's command-line side: the config file and its keys are checked before absl
parses them (a typo gets one line naming it and what is valid, not a traceback), progress is
shown on a terminal or in logs, and Ctrl-C / SIGTERM stop the loop cleanly (`StopOnSignal`).

  * `--config=PATH[:arg]`: PATH may be relative to the working directory or to the repository
    (so `configs/gspo.py` works from any directory); a missing file, or a file that is not a
    method config (configs/common.py, configs/sft_arith.py, configs/real/base.py), is named.
  * `--config.a.b=value`: an unknown key is named with the nearest valid ones.
"""

import functools
import glob
import importlib.util
import json
import os
import signal
import sys
import time

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags
import numpy as np

from jtc import checks
from jtc import files

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


def define_train_flags():
  """Command-line flags, defined only when run as a program (so `jtc.sft` can coexist)."""
  config_flags.DEFINE_config_file(
      'config', None, 'Training config: configs/<method>.py[:smoke|runlocal] with methods '
      f'{", ".join(methods())}, or configs/real/*.py; override any key with '
      '--config.<section>.<key>=value (every key is documented in configs/common.py).',
      lock_config=True)
  flags.DEFINE_string(
      'workdir', None, 'Where checkpoints, config.json and metrics.jsonl go; '
      'a workdir holding a run of the same config resumes it.')
  flags.DEFINE_bool(
      'allow_config_change', False, 'Resume a workdir whose run was made with '
      'another config (the differing keys are listed when this is refused).')
  flags.mark_flags_as_required(['config', 'workdir'])


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


def parse_flags(argv):
  """absl flags parser for `app.run`: the checks above, then absl's own parsing."""
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
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(f'{e}\nRun with --help for the flags; every config key is documented in '
          'configs/common.py')


class StopOnSignal:
  """Within the block, SIGINT / SIGTERM only set ``signal`` (the loop checkpoints and stops);
  a second one stops at once. The previous handlers come back on exit."""

  def __enter__(self):
    self.signal, self._old = None, {}
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._old[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.signal:  # a second signal: the default behaviour
      signal.signal(signum, self._old[signum])
      signal.raise_signal(signum)
    self.signal = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._old.items():
      signal.signal(sig, handler)


class Progress:
  """A tqdm bar on a terminal; else (nohup, cluster logs) one line every ``every`` steps with
  step, reward, accuracy, steps/s and the time left. A population's line shows the members'
  mean and [min, max]."""

  def __init__(self, total, start, *, every, show=True):
    self.total, self.start, self.t0 = total, start, time.perf_counter()
    self.every = every if show else 0
    self.bar = None
    if show and sys.stderr.isatty():
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      self.bar = tqdm(total=total, initial=start, desc='rl', dynamic_ncols=True, file=sys.stderr)

  @staticmethod
  def summary(metrics, key):
    """'0.512' for one run; '0.512 [0.450, 0.580]' (mean [min, max]) for a population."""
    values = [m[key] for m in metrics]
    if len(values) == 1:
      return f'{values[0]:.3f}'
    return f'{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]'

  def update(self, step, metrics):
    """``metrics``: the step's metrics of each member (a list of one for a run)."""
    reward, acc = self.summary(metrics, 'reward_mean'), self.summary(metrics, 'accuracy')
    if self.bar is not None:
      self.bar.update(1)
      self.bar.set_postfix(reward=reward, acc=acc)
    elif self.every and (step % self.every == 0 or step == self.total):
      rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
      eta = (self.total - step) / max(rate, 1e-9)
      members = f' ({len(metrics)} members: mean [min, max])' if len(metrics) > 1 else ''
      print(
          f'step {step}/{self.total} reward {reward} accuracy {acc} '
          f'{rate:.2f} steps/s ETA {eta / 60:.1f} min{members}', file=sys.stderr, flush=True)

  def close(self):
    if self.bar is not None:
      self.bar.close()


def train_main(trainer_cls):
  """`python -m jtc.train` (after `define_train_flags`): ``trainer_cls(config, workdir).run()``; the errors a
  user can cause print one line, SIGINT / SIGTERM exit with 128 + the signal number after a
  checkpoint."""
  with files.report_damage():
    app.run(functools.partial(_train, trainer_cls), flags_parser=parse_flags)


def _train(trainer_cls, argv):
  from jtc.rl import checkpoints  # pylint: disable=import-outside-toplevel
  from jtc.rl import distributed  # pylint: disable=import-outside-toplevel
  from jtc.rl import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # orbax and tfds are chatty at INFO
  try:
    # Several processes: before any other JAX work.
    distributed.initialize(timeout_s=flags.FLAGS.config.distributed.coordinator_timeout_s)
    distributed.check_agreement(json.loads(flags.FLAGS.config.to_json_best_effort()))
    trainer = trainer_cls(flags.FLAGS.config, flags.FLAGS.workdir,
                          allow_config_change=flags.FLAGS.allow_config_change)
  except (ValueError, workdir_lib.WorkdirError, checkpoints.CheckpointMismatch,
          distributed.DistributedError) as e:
    _fail(str(e))
  with distributed.exit_when_a_peer_is_lost():
    last, stopped = trainer.run()
  for path, record in zip(trainer.member_dirs if trainer.primary else [], last):  # a line a member
    shown = {
        k: v for k, v in record.items() if 'eval' in k or k in ('step', 'reward_mean', 'accuracy')
    }
    if len(last) > 1:
      shown = {'member': os.path.relpath(path, trainer.workdir), **shown}
    print(json.dumps(shown))
  if stopped:
    sys.exit(128 + signal.Signals[stopped].value)
