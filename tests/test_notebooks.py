"""Executes every notebook headless (their own `assert` cells check the claimed properties) and
checks they are committed executed, with their outputs (figures visible when browsing)."""
import json
import os
import sys

import nbformat
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = [
    'per_token_gradients.ipynb', 'toy_appendix_a.ipynb', 'delta_tokens.ipynb', 'credit_tokens.ipynb'
]


@pytest.fixture(scope='module')
def kernel_env(tmp_path_factory):
  """A 'python3' kernelspec that runs *this* interpreter, found first via JUPYTER_PATH."""
  root = tmp_path_factory.mktemp('jupyter')
  spec_dir = root / 'kernels' / 'python3'
  spec_dir.mkdir(parents=True)
  (spec_dir / 'kernel.json').write_text(
      json.dumps({
          'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
          'display_name': 'jtc python3',
          'language': 'python'
      }))
  old = {k: os.environ.get(k) for k in ('JUPYTER_PATH', 'MPLBACKEND', 'JAX_PLATFORMS')}
  os.environ['JUPYTER_PATH'] = str(root)
  os.environ['MPLBACKEND'] = 'Agg'
  os.environ['JAX_PLATFORMS'] = 'cpu'
  yield
  for k, v in old.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_committed_executed_with_outputs(name):
  """Every code cell ran (in order), none failed, and the figures are in the file."""
  nb = nbformat.read(os.path.join(REPO, 'notebooks', name), as_version=4)
  code = [c for c in nb.cells if c.cell_type == 'code']
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), name
  assert not any(o.get('output_type') == 'error' for c in code for o in c.outputs), name
  assert any('image/png' in o.get('data', {}) for c in code for o in c.outputs), name


# Executing a notebook takes from 15 s to minutes: the slow set only (every committed notebook's
# outputs are checked above).
SLOW = tuple(NOTEBOOKS)


@pytest.mark.parametrize(
    'name', [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NOTEBOOKS])
def test_notebook_runs(name, kernel_env):
  del kernel_env
  from nbclient import NotebookClient  # pylint: disable=import-outside-toplevel
  nb = nbformat.read(os.path.join(REPO, 'notebooks', name), as_version=4)
  client = NotebookClient(nb, kernel_name='python3', timeout=300,
                          resources={'metadata': {
                              'path': REPO
                          }})
  client.execute()  # raises CellExecutionError (with the traceback) if any assert fails
  text = '\n'.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code' for o in c.outputs)
  assert 'Error' not in text
