"""jtc installs like a package: the wheel `pip install .` builds carries every subpackage, the
repository's configs/ and experiments/ (the sweeps too) under jtc's own namespace and no other
top-level name, the shipped policies and the console script; the `test` extra leaves libtpu out
(jax's CPU start-up stays quiet) and the README's test command adds it with `plan`; a
non-editable install in a fresh virtualenv trains and runs the experiments' command from a
directory outside the repository."""
import importlib.util
import os
import re
import runpy
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
  out = tmp_path_factory.mktemp('wheel')
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', REPO, '-w',
                  str(out)], check=True, capture_output=True, cwd=out)
  (path,) = out.glob('jtc-*.whl')
  return path


def source_packages(top):
  """Every folder with an __init__.py under ``top`` of the repository, as a wheel path."""
  found = []
  for folder, _, files in os.walk(os.path.join(REPO, top)):
    if '__init__.py' in files and '__pycache__' not in folder:
      found.append(os.path.relpath(folder, REPO) + '/__init__.py')
  return found


def test_the_wheel_carries_every_package_the_policies_and_the_console_script(wheel):
  names = set(zipfile.ZipFile(wheel).namelist())
  packages = source_packages('jtc') + [
      f'jtc/_shipped/{p}' for top in ('configs', 'experiments') for p in source_packages(top)
  ]
  assert 'jtc/_shipped/experiments/sweeps/__init__.py' in packages  # a pattern once missed it
  assert not sorted(set(packages) - names)
  # No generic top-level package (configs, experiments) lands in site-packages.
  assert {n.split('/')[0] for n in names} == {'jtc', f'{wheel.name.split("-py")[0]}.dist-info'}
  for policy in ('base_policy', 'phrasing_policy', 'moe_policy'):
    assert {f'jtc/assets/{policy}/{f}' for f in ('params.msgpack', 'model.json')} <= names
  (entry_points,) = [n for n in names if n.endswith('entry_points.txt')]
  assert 'jtc = jtc.cli:main' in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_a_non_editable_install_trains_and_runs_the_experiments_from_elsewhere(wheel, tmp_path):
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
  python, jtc = venv / 'bin' / 'python', venv / 'bin' / 'jtc'
  subprocess.run([str(python), '-m', 'pip', 'install', '-q',
                  str(wheel)], check=True, capture_output=True)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  run = lambda *cmd: subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True)
  where = run(str(python), '-c', 'import jtc; print(jtc.__file__)')
  assert where.returncode == 0 and REPO not in where.stdout and str(venv) in where.stdout
  assert run(str(python), '-c', 'import configs').returncode != 0  # nothing generic installed
  train = run(str(jtc), 'train', '--config', 'configs/gspo.py:smoke', '--workdir',
              str(tmp_path / 'run'))
  assert train.returncode == 0, train.stderr[-2000:]
  assert (tmp_path / 'run' / 'metrics.jsonl').exists()
  helped = run(str(jtc), 'sweep', '--help')
  assert helped.returncode == 0 and helped.stdout.startswith('usage: jtc sweep')
  default = run(
      str(python), '-c', 'from jtc.cli import absl_program; absl_program.repo_on_path(); '
      'from experiments import run; print(run.RESULTS_DIR)')
  assert default.stdout.strip() == str(elsewhere / 'experiments' / 'results')  # not site-packages
  empty = run(str(jtc), 'sweep', 'table1', '--tables-only')  # no summaries here: refused
  assert empty.returncode == 2 and 'no run summaries' in empty.stderr
  assert not (elsewhere / 'experiments').exists()


def test_the_test_extra_leaves_libtpu_out_and_the_readme_test_command_adds_the_plan_extra():
  """`pip install -e ".[test]"` keeps jax's CPU start-up quiet (no libtpu); the README's test
  command, which CI runs verbatim (.ci/run), installs `plan` too, so tests/plan compile for TPUs
  there and a CI without libtpu fails here rather than skipping them."""
  import setuptools  # pylint: disable=import-outside-toplevel
  with pytest.MonkeyPatch.context() as patch:
    seen = {}
    patch.setattr(setuptools, 'setup', lambda **kw: seen.update(kw))
    runpy.run_path(os.path.join(REPO, 'setup.py'))
  extras = seen['extras_require']
  assert not [r for r in extras['test'] if 'tpu' in r] and extras['plan'] == ['jax[tpu]']
  with open(os.path.join(REPO, 'README.md')) as f:
    readme = f.read().splitlines()
  command = readme[readme.index('# install and run the tests') + 1]
  assert re.search(r'pip install -e "\.\[(test,plan|plan,test)\]"', command), command
  if os.environ.get('CI'):
    assert importlib.util.find_spec('libtpu') is not None, 'CI runs tests/plan with libtpu'
