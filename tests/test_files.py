"""Every file jtc reads back fails by name when damaged (jtc.files and its users).

For each kind of file, written by jtc's own writer: the reader that jtc uses on it succeeds on
the intact file (the control), and on the file cut in half, overwritten with random bytes of
the same length, or emptied it raises an error naming the file and saying it looks damaged,
never numpy's pickle suggestion. (metrics.jsonl cut or emptied is what a killed run leaves: its
records up to the cut are read.) The commands print that error as one line without a
traceback (a subprocess per command).
"""
import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import common
from experiments import report
from experiments import summaries
from jtc import files
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import metric_writer
from jtc.analysis import curve_plots
from jtc.data import datasets
from jtc.data import formats
from jtc.models import bundles
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import checkpoints
from jtc.rl import workdir as workdir_lib
from configs import gspo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAMAGES = {
    'truncated': lambda data: data[:len(data) // 2],
    'random bytes': lambda data: np.random.default_rng(0).bytes(max(len(data), 64)),
    'empty': lambda data: b'',
}
SPEC = {'kind': 'char'}


def _model():
  config = model_lib.ModelConfig.tiny(vocab_size=tokenizer_lib.from_spec(SPEC).vocab_size,
                                      n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8,
                                      d_ff=32)
  return config, model_lib.init_params(config, jax.random.key(0))


def _ledger(tmp):
  """A run directory with the ledger of step 2; (run dir, its ledger's directory)."""
  config, params = _model()
  columns = {
      k: np.zeros((4, 3) if k.endswith('T') else (4,), np.float32) for k in ledger_lib.COLUMNS
  }
  meta = {k: 0 for k in ledger_lib.META_KEYS}
  path = ledger_lib.write(os.path.join(tmp, ledger_lib.LEDGER_DIR, '2'), columns=columns, meta=meta,
                          model_config=config, params_by_update={0: params})
  return tmp, path


def _ledger_kind(name):

  def make(tmp):
    run_dir, path = _ledger(tmp)
    return os.path.join(path, name), lambda: ledger_lib.load(run_dir, 2).params(0)

  return make


def _bundle_kind(name):

  def make(tmp):
    config, params = _model()
    bundles.save_policy_bundle(tmp, model_config=config, params=params, tokenizer_spec=SPEC,
                               meta={'made_by': 'test'})
    return os.path.join(tmp, name), lambda: bundles.load_policy_bundle(tmp)

  return make


def _metrics(tmp):
  writer = metric_writer.MetricWriter(tmp)
  for step in range(6):
    writer.write(step, {'reward_mean': step / 10, 'loss': -step / 3})
  writer.close()
  return os.path.join(
      tmp, 'metrics.jsonl'), lambda: metric_writer.read_jsonl(os.path.join(tmp, 'metrics.jsonl'))


def _config_json(tmp):
  config = gspo.get_config('smoke')
  workdir_lib.record_config(tmp, config, config.num_steps)
  return os.path.join(tmp, workdir_lib.CONFIG_FILE), lambda: workdir_lib.check_identity(
      tmp, config, has_checkpoint=False)


def _member_json(tmp):
  member = os.path.join(tmp, 'members', 'seed0')
  os.makedirs(member)
  with open(os.path.join(member, workdir_lib.MEMBER_FILE), 'w') as f:
    json.dump({'index': 0, 'population_workdir': tmp, 'seed': 0}, f)
  return os.path.join(member, workdir_lib.MEMBER_FILE), lambda: metric_writer.run_dirs(tmp)


def _summary_kind(suffix):

  def make(tmp):
    summary = {k: 0 for k in common.SUMMARY_KEYS}
    path = os.path.join(tmp, 'runs', f'gspo_seed0{suffix}')
    summaries.write_json(path, dict(summary, curves={}, final={'step': 2}))
    return path, lambda: common.load_summaries(tmp)

  return make


def _invocation(tmp):
  path = os.path.join(tmp, 'invocation.json')
  summaries.write_json(path, {'parts': [{'command': 'x', 'wall_time_s': 1.0}]})
  return path, lambda: report.read_parts(path)


def _token_cloud(tmp):
  with open(os.path.join(tmp, 'token_cloud.json'), 'w') as f:
    json.dump({'top': [], 'bottom': []}, f)
  return os.path.join(tmp, 'token_cloud.json'), lambda: curve_plots.plot_token_clouds(
      [tmp], os.path.join(tmp, 'clouds.png'))


def _checkpoint(tmp):
  """A checkpoint's metadata: the one step unreadable, so nothing to resume from."""
  state, run = {'w': np.arange(6.0).reshape(2, 3)}, {'n': np.zeros(2)}
  ckpt = checkpoints.TrainCheckpointer(tmp)
  ckpt.save(1, state=state, run_state=run, extra={'data_state': 1})
  ckpt.close()
  return os.path.join(
      tmp, '1', 'state',
      '_METADATA'), lambda: checkpoints.TrainCheckpointer(tmp).restore_latest(state, run)


def _dataset_jsonl(tmp):
  path = os.path.join(tmp, 'train.jsonl')
  with open(path, 'w') as f:
    for i in range(20):
      f.write(json.dumps({'question': f'What is {i}+{i}?', 'answer': str(2 * i)}) + '\n')
  return path, lambda: formats.read_files('jsonl', [path])


def _prepared_kind(pattern):

  def make(tmp):
    kw = dict(split='train', data_dir=tmp, num_examples={'train': 64, 'test': 8})
    datasets.data_source('arithmetic', **kw)
    (path,) = glob.glob(os.path.join(tmp, '*', '*', '*', pattern))
    return path, lambda: datasets.data_source('arithmetic', **kw)

  return make


KINDS = {
    'ledger.npz': _ledger_kind('ledger.npz'),
    'ledger meta.json': _ledger_kind('meta.json'),
    'ledger model.json': _ledger_kind('model.json'),
    'ledger params msgpack': _ledger_kind('params_update0.msgpack'),
    'metrics.jsonl': _metrics,
    'workdir config.json': _config_json,
    'member.json': _member_json,
    'run summary': _summary_kind('.json.gz'),
    'run summary (plain, before jtc 0.2)': _summary_kind('.json'),
    'invocation.json': _invocation,
    'token_cloud.json': _token_cloud,
    'checkpoint metadata': _checkpoint,
    'dataset JSONL': _dataset_jsonl,
    'prepared dataset records': _prepared_kind('*-train.array_record*'),
    'prepared dataset info': _prepared_kind('dataset_info.json'),
    'policy model.json': _bundle_kind('model.json'),
    'policy tokenizer.json': _bundle_kind('tokenizer.json'),
    'policy params.msgpack': _bundle_kind('params.msgpack'),
    'policy meta.json': _bundle_kind('meta.json'),
}


@pytest.mark.parametrize('damage', DAMAGES)
@pytest.mark.parametrize('kind', KINDS)
def test_a_damaged_file_fails_naming_it(tmp_path, kind, damage):
  path, read = KINDS[kind](str(tmp_path))
  intact = read()
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(DAMAGES[damage](data))
  if kind == 'metrics.jsonl' and damage != 'random bytes':
    # A cut last line, or no line yet, is what a killed run leaves (its resume rewrites the
    # file): the records before the cut are read, no more.
    kept = read()
    assert len(kept) < len(intact) and kept == intact[:len(kept)]
    return
  with pytest.raises(ValueError) as error:
    read()
  message = str(error.value)
  assert 'pickle' not in message
  if isinstance(error.value, files.DamagedFile):  # the file, or the directory holding it
    assert path.startswith(error.value.path) and error.value.path in message, message
  else:  # a dataset is the user's JSONL: its own errors name the file and line
    assert kind == 'dataset JSONL' and path in message, message
    assert any(why in message for why in ('malformed JSON', 'has no records', 'not UTF-8')), message


def _ledger_command(tmp):
  run_dir, path = _ledger(tmp)
  return os.path.join(path, 'ledger.npz'), [
      '-m', 'jtc.ledger', 'replay', run_dir, '--step', '2', '--objectives', 'grpo'
  ]


def _train_command(tmp):
  path, _ = _config_json(tmp)
  return path, ['-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={tmp}']


def _sweep_command(tmp):
  path, _ = _summary_kind('.json.gz')(os.path.join(tmp, 'smoke', 'table1_confirm'))
  return path, [
      '-m', 'experiments.run', 'table1_confirm', '--smoke', '--tables-only', '--results-root', tmp
  ]


@pytest.mark.parametrize('command', [_ledger_command, _train_command, _sweep_command])
def test_a_command_reading_a_damaged_file_says_so_in_one_line(tmp_path, command):
  """The issue's case first: a step's ledger.npz overwritten with random bytes."""
  path, argv = command(str(tmp_path))
  with open(path, 'rb') as f:
    damaged = DAMAGES['random bytes'](f.read())
  with open(path, 'wb') as f:
    f.write(damaged)
  proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode != 0
  assert 'Traceback' not in proc.stderr and 'pickle' not in proc.stderr, proc.stderr
  said = [l for l in proc.stderr.splitlines() if f'damaged file {path}' in l]
  assert len(said) == 1 and 'looks truncated or overwritten' in said[0], proc.stderr
  with open(path, 'rb') as f:
    assert f.read() == damaged  # left as it is
