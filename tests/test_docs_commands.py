"""Every command in the docs still exists: the `python -m MODULE ...`, `python path/to/x.py ...`
and `jtc COMMAND ...` lines of the shell fences of README.md and docs/*.md name a module of the
repository, and its argument parser (absl flags with the config file and its --config.* keys, or
argparse) accepts their flags. Nothing is run: the parsers are only asked."""
import argparse
import contextlib
import glob
import importlib
import io
import os
import re
import shlex

from absl import flags
import pytest

from jtc.cli import absl_program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = ('jtc', 'experiments', 'benchmarks')
FENCE = re.compile(r'^```(\w*)\n(.*?)^```', re.M | re.S)
SHELL_FENCES = ('', 'bash', 'sh', 'shell')
SEPARATORS = {';', '&&', '||', '|', '&', 'do', 'done', 'then', 'else', 'fi', '(', ')'}
COMMAND_MODULES = {
    f'jtc.{c}': f'jtc.cli.{c}' for c in ('train', 'sft', 'ledger', 'plot', 'plan', 'data')
}


def fenced_commands(text):
  """[(module, args)] of the commands in the shell fences of a markdown text: `python -m M`,
  `python path/m.py` (module 'path.m') and `jtc C` (module 'jtc', C first of the args)."""
  found = []
  for lang, body in FENCE.findall(text):
    if lang not in SHELL_FENCES:
      continue
    for line in body.replace('\\\n', ' ').splitlines():
      lexer = shlex.shlex(line, posix=True, punctuation_chars=';&|()')
      lexer.whitespace_split = True
      segment = []
      for token in list(lexer) + [';']:
        if token in SEPARATORS:
          found += _command(segment)
          segment = []
        else:
          segment.append(token)
  return found


def _command(tokens):
  while tokens and (re.match(r'^\w+=', tokens[0]) or tokens[0] == 'time'):
    tokens = tokens[1:]  # environment assignments, `time`
  if tokens[:1] == ['jtc']:
    return [('jtc', tokens[1:])]
  if tokens[:1] in (['python'], ['python3']) and len(tokens) > 1:
    if tokens[1] == '-m' and len(tokens) > 2:
      return [(tokens[2], tokens[3:])]
    if tokens[1].endswith('.py'):
      return [(tokens[1][:-3].replace('/', '.'), tokens[2:])]
  return []


def _argparse_parser(module):
  """The argparse parser ``module.main()`` builds (its parse_args stopped before anything runs)."""
  if hasattr(module, 'make_parser'):
    return module.make_parser()

  class Built(Exception):

    def __init__(self, parser):
      super().__init__()
      self.parser = parser

  def stop(parser, *args, **kwargs):
    raise Built(parser)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(argparse.ArgumentParser, 'parse_args', stop)
    patch.setattr('sys.argv', [module.__name__])
    try:
      module.main()
    except Built as built:
      return built.parser
  raise AssertionError(f'{module.__name__}.main() built no argparse parser')


def check_command(module_name, args):
  """ValueError naming what no longer exists: the module, the command or a flag."""
  if module_name == 'jtc':
    from jtc import cli  # pylint: disable=import-outside-toplevel
    if not args or args[0] not in cli.COMMANDS:
      raise ValueError(f'jtc {args[:1]}: not one of {list(cli.COMMANDS)}')
    module_name, args = f'jtc.cli.{args[0].replace("-", "_")}', args[1:]
  module_name = COMMAND_MODULES.get(module_name, module_name)
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    raise ValueError(f'no module {module_name}: {e}') from None
  err = io.StringIO()
  try:
    with contextlib.redirect_stderr(err), contextlib.chdir(REPO):
      if hasattr(module, 'define_flags'):  # absl: the command's own parsing, config included
        argv, fv = [module_name, *args], flags.FlagValues()
        module.define_flags(fv, argv)
        getattr(module, 'parse_flags', absl_program.parse_flags)(argv, fv)
      else:
        _argparse_parser(module).parse_args(args)
  except (SystemExit, flags.Error, ValueError, KeyError, AttributeError) as e:
    raise ValueError(f'{module_name} {shlex.join(args)}: {e} {err.getvalue().strip()}') from None


def _doc_commands():
  out = []
  for path in ['README.md'] + sorted(glob.glob(os.path.join(REPO, 'docs', '*.md'))):
    with open(os.path.join(REPO, path)) as f:
      for module, args in fenced_commands(f.read()):
        if module.split('.')[0] in OURS:
          out.append(pytest.param(module, args, id=f'{os.path.basename(path)}:{module}'))
  return out


def test_commands_are_read_from_fences_only():
  text = ('`python -m nope` inline\n```bash\nX=1 python -m jtc.train --a b \\\n  --c d & done\n'
          'jtc plot W --out x.png  # a comment\n# python -m commented.out\n```\n'
          '```text\npython -m jtc.train --config configs/<method>.py\n```\n'
          '```python\nimport os\n```\n')
  assert fenced_commands(text) == [('jtc.train', ['--a', 'b', '--c', 'd']),
                                   ('jtc', ['plot', 'W', '--out', 'x.png'])]


@pytest.mark.parametrize('module,args', [
    ('jtc', ['train', '--config', 'configs/gspo.py', '--workdir', 'W', '--made_up_flag']),
    ('jtc.train', ['--config', 'configs/gspo.py', '--workdir', 'W', '--config.optim.made_up=1']),
    ('jtc.sft', ['--config', 'configs/sft_arith.py', '--workdir', 'W', '--made_up_flag']),
    ('jtc.plot', ['W', '--made-up']),
    ('jtc.data', ['gsm8k/', '--made-up']),
    ('jtc.ledger', ['replay', 'W', '--step', '2', '--objectives', 'gspo', '--made-up']),
    ('jtc', ['trian', 'W']),
    ('experiments.run', ['table1', '--made-up']),
    ('benchmarks.memory', ['--made-up']),
    ('jtc.no_such_command', []),
])
def test_a_made_up_command_or_flag_fails(module, args):
  with pytest.raises(ValueError):
    check_command(module, args)


def test_the_docs_have_commands():
  assert len(_doc_commands()) > 15


@pytest.mark.parametrize('module,args', _doc_commands())
def test_every_command_in_the_docs_exists(module, args):
  check_command(module, args)


def section_commands(path, heading):
  """The commands (as `fenced_commands` reads them) of the shell fences in the section of the
  markdown file ``path`` (relative to the repository) under ``## heading``, for a test that runs
  them."""
  with open(os.path.join(REPO, path)) as f:
    text = f.read()
  start = text.index(f'\n## {heading}\n')
  end = text.find('\n## ', start + 1)
  return fenced_commands(text[start:end if end > 0 else len(text)])
