"""jtc installs like a package: the wheel `pip install .` builds carries every subpackage (the
sweeps too), the shipped policies and the console script, and a non-editable install in a fresh
virtualenv trains and runs the experiments' command from a directory outside the repository."""
import os
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
  packages = [p for top in ('jtc', 'configs', 'experiments') for p in source_packages(top)]
  assert 'experiments/sweeps/__init__.py' in packages  # the one a find_packages pattern missed
  assert not sorted(set(packages) - names)
  for policy in ('base_policy', 'phrasing_policy'):
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
  where = run(str(python), '-c',
              'import jtc, experiments; print(jtc.__file__, experiments.__file__)')
  assert where.returncode == 0 and REPO not in where.stdout and str(venv) in where.stdout
  train = run(str(jtc), 'train', '--config', 'configs/gspo.py:smoke', '--workdir',
              str(tmp_path / 'run'))
  assert train.returncode == 0, train.stderr[-2000:]
  assert (tmp_path / 'run' / 'metrics.jsonl').exists()
  helped = run(str(python), '-m', 'experiments.run', '--help')
  assert helped.returncode == 0 and 'sweep' in helped.stdout
  default = run(str(python), '-c', 'from experiments import run; print(run.RESULTS_DIR)')
  assert default.stdout.strip() == str(elsewhere / 'experiments' / 'results')  # not site-packages
