"""Every benchmark module imports, every import it makes (inside its functions too) names a
module and a name that exist, and each command's --help runs: a benchmark that cannot start
(as `gpu_preflight` could not, importing a module removed in 0.2) fails here, not on a GPU."""
import ast
import glob
import importlib
import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(REPO, 'benchmarks', '*.py'))
    if not p.endswith('__init__.py'))


def imports_of(path):
  """[(module, name or None)] of every import statement in the file, nested ones included."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(a.name, None) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out += [(node.module, a.name) for a in node.names]
  return out


def missing(imports):
  """The imports of ``imports`` that do not resolve (a jtc or benchmarks module or name)."""
  bad = []
  for module, name in imports:
    if module.split('.')[0] not in ('jtc', 'benchmarks', 'configs'):
      continue  # third-party: the extras' business
    if importlib.util.find_spec(module) is None:
      bad.append(module)
    elif name and not (hasattr(importlib.import_module(module), name) or
                       importlib.util.find_spec(f'{module}.{name}')):
      bad.append(f'{module}.{name}')
  return bad


def test_a_removed_module_is_found():
  """Known positive: the import `gpu_preflight` made before (jtc.rl.cli, gone in 0.2)."""
  assert missing([('jtc.rl', 'cli'), ('jtc.rl.cli', None)]) == ['jtc.rl.cli', 'jtc.rl.cli']
  assert not missing([('jtc.rl', 'step'), ('jtc.cli.absl_program', 'load_config')])


@pytest.mark.parametrize('name', MODULES)
def test_every_benchmark_imports_and_its_help_runs(name, monkeypatch, capsys):
  path = os.path.join(REPO, 'benchmarks', f'{name}.py')
  assert not missing(imports_of(path))
  module = importlib.import_module(f'benchmarks.{name}')
  if hasattr(module, 'main'):
    monkeypatch.setattr(sys, 'argv', [f'benchmarks.{name}', '--help'])
    with pytest.raises(SystemExit) as stop:
      module.main()
    assert stop.value.code == 0 and 'usage:' in capsys.readouterr().out
