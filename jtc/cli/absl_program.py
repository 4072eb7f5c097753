"""Running an absl command (`jtc train`, `jtc sft`) from ``main(argv)``: its flags are defined
when it runs, replacing another command's of the same name (so the commands coexist in one
process), and listed by ``--help``."""
import sys

from absl import app
from absl import flags

_DEFINED = set()  # flags defined by the command that ran last in this process


def run(main_fn, argv, *, prog, define_flags, flags_parser=None):
  """``app.run(main_fn)`` on ``[prog, *argv]`` (``argv`` None: the process's arguments) after
  ``define_flags(flags.FLAGS, argv)``, whose returned flag names ``--help`` then lists."""
  argv = [prog, *(sys.argv[1:] if argv is None else argv)]
  for name in _DEFINED & set(flags.FLAGS):
    delattr(flags.FLAGS, name)
  _DEFINED.clear()
  for name in define_flags(flags.FLAGS, argv):
    _DEFINED.add(name)
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  kwargs = {'flags_parser': flags_parser} if flags_parser else {}
  app.run(main_fn, argv=argv, **kwargs)
