"""The layout of the repository: tests mirror the tree, and no module is over 400 lines.

Every module of jtc/ and experiments/ with logic (a function or a class) has a test file of its
name, tests/<package path>/test_<module>.py (a package's __init__: test_<package>.py). Modules
that only declare data or only run another module's `main` (`python -m jtc.train`) need none;
benchmarks/ are measured by hand. The one module over 400 lines is a frozen copy kept verbatim
as a reference (tests/models/reference_sampler.py)."""
import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('jtc', 'experiments')
MAX_LINES = 400
FROZEN = ('tests/models/reference_sampler.py',)


def has_logic(source):
  """A top-level function or class (outside ``if __name__ == '__main__'``)."""
  return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.parse(source).body)


def expected_test(path):
  """tests/... path that should test the module at ``path`` (relative to the repository)."""
  folder, name = os.path.split(path)
  parts = folder.split(os.sep)
  parts = parts[1:] if parts[0] == 'jtc' else parts  # jtc/rl/x.py -> tests/rl/test_x.py
  if name == '__init__.py':
    return os.path.join('tests', *parts, f'test_{parts[-1]}.py')
  return os.path.join('tests', *parts, f'test_{name[:-3]}.py')


def modules_without_tests(root, packages):
  missing = []
  for package in packages:
    for folder, _, files in os.walk(os.path.join(root, package)):
      for name in sorted(files):
        path = os.path.relpath(os.path.join(folder, name), root)
        if not name.endswith('.py'):
          continue
        with open(os.path.join(root, path)) as f:
          logic = has_logic(f.read())
        if logic and not os.path.exists(os.path.join(root, expected_test(path))):
          missing.append(f'{path} -> {expected_test(path)}')
  return missing


def test_the_expected_test_paths():
  assert expected_test('jtc/rl/batch.py') == 'tests/rl/test_batch.py'
  assert expected_test('jtc/checks.py') == 'tests/test_checks.py'
  assert expected_test('jtc/cli/__init__.py') == 'tests/cli/test_cli.py'
  assert expected_test('experiments/sweeps/base.py') == 'tests/experiments/sweeps/test_base.py'
  assert has_logic(
      'def f():\n  pass\n') and not has_logic("X = 1\nif __name__ == '__main__':\n  f()\n")


def test_a_module_without_its_test_file_is_found(tmp_path):
  (tmp_path / 'jtc' / 'rl').mkdir(parents=True)
  (tmp_path / 'jtc' / 'rl' / 'new.py').write_text('def f():\n  return 1\n')
  (tmp_path / 'jtc' / 'rl' / 'table.py').write_text('ROWS = (1, 2)\n')
  assert modules_without_tests(str(tmp_path), ['jtc']) == ['jtc/rl/new.py -> tests/rl/test_new.py']


def test_every_module_with_logic_has_its_test_file():
  assert not modules_without_tests(REPO, PACKAGES)


def long_modules(root):
  """'path: n lines' of every .py file of ``root`` over MAX_LINES lines (not FROZEN)."""
  out = []
  for folder in ('jtc', 'experiments', 'benchmarks', 'configs', 'tests'):
    for path in glob.glob(os.path.join(root, folder, '**', '*.py'), recursive=True):
      rel = os.path.relpath(path, root)
      with open(path) as f:
        n = sum(1 for _ in f)
      if n > MAX_LINES and rel not in FROZEN:
        out.append(f'{rel}: {n} lines')
  return out


def test_a_long_module_is_found(tmp_path):
  (tmp_path / 'jtc').mkdir()
  (tmp_path / 'jtc' / 'long.py').write_text('x = 1\n' * (MAX_LINES + 1))
  (tmp_path / 'jtc' / 'short.py').write_text('x = 1\n' * MAX_LINES)
  assert long_modules(str(tmp_path)) == [f'jtc/long.py: {MAX_LINES + 1} lines']


def test_no_module_is_over_400_lines():
  assert not long_modules(REPO)
