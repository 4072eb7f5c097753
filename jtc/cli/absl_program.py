"""What the absl commands (`jtc train`, `jtc sft`) share: their flags are defined when they run,
replacing another command's of the same name (so the commands coexist in one process), and
listed by ``--help``; the config file and its ``--config.a.b=value`` keys are checked before absl
parses them, so a typo is one line naming it and the nearest valid keys, not a traceback."""
import importlib.util
import json
import os
import sys
import textwrap

from absl import app
from absl import flags
from absl import logging

from jtc import checks
from jtc import files
from jtc.rl import distributed

_JTC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folder holding `configs/` and `experiments/`: the checkout, or in an installed jtc the copy
# shipped under its namespace (setup.py), which jtc's commands put on their own import path.
SHIPPED = os.path.join(_JTC, '_shipped')
REPO = SHIPPED if os.path.isdir(os.path.join(SHIPPED, 'configs')) else os.path.dirname(_JTC)
_DEFINED = set()  # flags defined by the command that ran last in this process
HELP_FLAGS = ('-h', '--help', '--helpshort', '--helpfull')


def fail(message):
  """Exits with one line, ``error: <message>``."""
  sys.exit(f'error: {message}')


def config_flag(argv):
  """(index, 'PATH[:arg]', prefix) of the --config value in argv, or (None, None, '')."""
  for i, a in enumerate(argv):
    if a.startswith('--config='):
      return i, a[len('--config='):], '--config='
    if a == '--config' and i + 1 < len(argv):
      return i + 1, argv[i + 1], ''
  return None, None, ''


def resolve_path(spec):
  """'PATH[:arg]' with PATH made absolute: relative to the working directory, else to the
  repository (so `configs/x.py` works from any directory); unchanged when neither has it."""
  path, sep, arg = spec.partition(':')
  for candidate in (path, os.path.join(REPO, path)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate) + sep + arg
  return spec


def repo_on_path():
  """Makes `configs` and `experiments` importable in this process (`REPO` first on its path)."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)


def load_config(spec):
  """``get_config(arg)`` of the config file 'PATH[:arg]'."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_jtc_config', path)
  module = importlib.util.module_from_spec(module_spec)
  repo_on_path()  # configs import `configs.common`
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def check_override_keys(config, argv):
  """Every --config.a.b=value names a key of the config, or one line naming it and the nearest."""
  keys = list(checks.flatten(config.to_dict()))
  for a in argv:
    if a.startswith('--config.'):
      key = a[len('--config.'):].partition('=')[0]
      if key not in keys and not any(k.startswith(key + '.') for k in keys):
        fail(f'unknown config key config.{key}{checks.nearest(key, keys)} '
             '(every key is documented in configs/common.py)')


def parse_flags(argv, flag_values=flags.FLAGS, *, resolve=resolve_path):
  """absl flags parser for `app.run`: the --config file (its path through ``resolve``) loads and
  its override keys exist, then absl's own parsing; every error exits with one line."""
  if not any(a in HELP_FLAGS for a in argv):
    i, spec, prefix = config_flag(argv)
    if i is not None:
      spec = resolve(spec)
      argv = list(argv)
      argv[i] = prefix + spec
      try:
        config = load_config(spec)
      except (ValueError, FileNotFoundError) as e:  # e.g. an unknown ':arg', a missing file
        fail(str(e))
      check_override_keys(config, argv)
  try:
    return flag_values(argv)
  except flags.Error as e:
    fail(f'{e}\nRun with --help for the flags; every config key is documented in '
         'configs/common.py')


def start(argv):
  """What a command does first, once its flags are parsed: no stray arguments, quiet logs,
  several processes joined (before any other JAX work) and agreeing on the config
  (`distributed.DistributedError` otherwise)."""
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # orbax and tfds are chatty at INFO
  timeout_s = flags.FLAGS.config.get('distributed', {}).get('coordinator_timeout_s', 0)
  distributed.initialize(timeout_s=timeout_s)  # several processes: before any other JAX work
  distributed.check_agreement(json.loads(flags.FLAGS.config.to_json_best_effort()))


def help_text(prog, doc, names, flag_values=flags.FLAGS):
  """What ``-h`` / ``--help`` print: the usage under the program name ``prog`` (``jtc train``),
  the command's description (the first paragraph of ``doc``) and its flags ``names``."""
  lines = [f'usage: {prog} [flags]', '']
  if doc:
    lines += [doc.strip().split('\n\n')[0], '']
  lines.append('flags:')
  for name in names:
    flag = flag_values[name]
    default = '' if flag.default is None else f' (default: {flag.default_as_str})'
    lines += textwrap.wrap(f'--{name}: {flag.help}{default}', 96, initial_indent='  ',
                           subsequent_indent='      ')
  return '\n'.join(lines)


def run(main_fn, argv, *, prog, define_flags, flags_parser=parse_flags):
  """``app.run(main_fn)`` on ``[prog, *argv]`` (``argv`` None: the process's arguments) after
  ``define_flags(flags.FLAGS, argv)``; ``-h`` / ``--help`` (or ``--helpshort``, ``--helpfull``)
  print `help_text` of the flags it returns and exit 0, before anything runs."""
  argv = [prog, *(sys.argv[1:] if argv is None else argv)]
  for name in _DEFINED & set(flags.FLAGS):
    delattr(flags.FLAGS, name)
  _DEFINED.clear()
  for name in define_flags(flags.FLAGS, argv):
    _DEFINED.add(name)
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  if any(a in HELP_FLAGS for a in argv[1:]):
    print(help_text(prog, sys.modules[main_fn.__module__].__doc__, sorted(_DEFINED)))
    sys.exit(0)
  with files.report_damage():
    app.run(main_fn, argv=argv, flags_parser=flags_parser)
