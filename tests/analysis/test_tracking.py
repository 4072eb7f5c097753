"""Tests of jtc.analysis.tracking (Weights & Biases), offline, never reaching the network: the
records logged, read back with wandb's own reader, equal metrics.jsonl step by step (non-finite
values too), the sample generations' tables equal samples.jsonl; a resumed run continues its
W&B run without logging a step twice, and W&B switched on for a resumed run logs the earlier
records first; a population's members are grouped runs with
their own streams; the mode's resolution, a missing package and importing jtc without wandb.

The trainer's runs with W&B: tests/rl/test_trainer.py (a single run) and
tests/rl/test_population.py (a population, resumed).
"""
import json
import math
import os
import subprocess
import sys

import pytest

from configs import common
from jtc.analysis import metric_writer
from jtc.analysis import samples
from jtc.analysis import tracking
from jtc.rl import config_check
from jtc.rl import trainer as trainer_lib
from tests import procs
from tests.analysis import test_samples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """This process's environment made `procs.offline_wandb_env`'s."""
  env = procs.offline_wandb_env(str(tmp_path / 'wandb_env'))
  for key in ('WANDB_API_KEY', 'WANDB_IDENTITY_TOKEN_FILE', 'WANDB_BASE_URL'):
    monkeypatch.delenv(key, raising=False)
  for key, value in env.items():
    if key.startswith('WANDB_') or key == 'NETRC':
      monkeypatch.setenv(key, value)
  return env


def _log(**keys):
  log = common.get_config().log
  log.wandb_project = 'jtc-tests'
  for k, v in keys.items():
    log[k] = v
  return log


def _run_dir(path, config):
  """A run directory as the trainer lays it out before the first step (its config.json)."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'config': config, 'schedule_num_steps': 3}, f)
  return str(path)


def _record(step, scale=1.0):
  """A step's metrics: floats, an int, a non-finite value; step 0 is an evaluation only."""
  if step == 0:
    return {'eval/avg@2': 0.25 * scale}
  return {
      'loss': scale * (0.1 + step),
      'grad_norm': float('nan') if step == 2 else scale * step**0.5,
      'ratio_min': -math.inf if step == 1 else 0.5,
      'compute/rollouts': 8 * step
  }


def _write(run_dir, steps, *, tracker, resume_step=0, scale=1.0, samples_every=0):
  log = common.get_config().log
  log.samples_every = samples_every
  writer = metric_writer.MetricWriter(run_dir, resume_step=resume_step, tracker=tracker, log=log,
                                      group_size=2)
  try:
    for step in steps:
      writer.write(step, _record(step, scale), rollout=test_samples.rollout(3, G=2, step=step))
  finally:
    writer.close()


def _start(run_dir, log, workdir=None):
  tracker, = tracking.start_runs(log, [run_dir], revision=lambda: 'rev-1', workdir=workdir or
                                 run_dir)
  return tracker


def _same(a, b):
  return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and
                    math.isnan(b))


def assert_equal_streams(logged, jsonl):
  """W&B's records equal metrics.jsonl's, step by step and key by key (its 'nan' strings read
  as the float)."""
  assert [r['step'] for r in logged] == [r['step'] for r in jsonl]
  for got, want in zip(logged, jsonl):
    want = {'step': want['step'], **tracking.for_wandb(want)}
    assert got.keys() == want.keys(), (got, want)
    for k in want:
      assert _same(got[k], want[k]), (k, got, want)


def _jsonl(run_dir):
  return metric_writer.read_jsonl(os.path.join(run_dir, 'metrics.jsonl'))


def test_a_run_logs_the_metrics_config_and_revision_of_its_stream(offline, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  run_dir = _run_dir(tmp_path / 'run', {'seed': 3, 'optim': {'learning_rate': 2e-4}})
  _write(run_dir, range(4), tracker=_start(run_dir, _log(wandb_tags='a, b', wandb_run_name='x')),
         samples_every=2)
  records = tracking.offline_records(run_dir)
  logged = tracking.history(records)
  assert_equal_streams(logged, _jsonl(run_dir))
  # The sample generations: a W&B table at each step that logs them, equal to samples.jsonl's.
  tables = tracking.offline_tables(run_dir, samples.TABLE)
  assert [t['step'] for t in tables] == [0, 2] and tables[0]['columns'] == list(samples.COLUMNS)
  assert [row for t in tables for row in t['data']
         ] == [[r[k] for k in samples.COLUMNS] for r in samples.read(run_dir)]
  assert math.isnan(logged[2]['grad_norm']) and logged[1]['ratio_min'] == -math.inf
  run, = [r['run'] for r in records if r['type'] == 'run']
  config = run['config']['update']
  assert config['seed'] == 3 and config['code_revision'] == 'rev-1'
  assert config['optim'] == {'learning_rate': 2e-4}
  assert run['display_name'] == 'x' and run['tags'] == ['a', 'b'] and 'run_group' not in run
  assert run['run_id'] == json.load(open(os.path.join(run_dir, 'wandb', tracking.STATE_FILE)))['id']
  # W&B's files in the run directory, never in the working directory.
  assert sorted(os.listdir(tmp_path)) == ['run', 'wandb_env']


def test_a_resume_continues_the_run_and_logs_each_step_once(offline, tmp_path):
  """W&B off for steps 0-1, switched on at a resume from step 1 (it logs 0 first), killed after
  step 3 and resumed from step 2: steps 2-3 are recomputed (equal) and not logged again."""
  run_dir = _run_dir(tmp_path / 'run', {'seed': 0})
  _write(run_dir, range(2), tracker=None)
  _write(run_dir, range(1, 4), tracker=_start(run_dir, _log()), resume_step=1)
  first_id = json.load(open(os.path.join(run_dir, 'wandb', tracking.STATE_FILE)))['id']
  _write(run_dir, range(2, 6), tracker=_start(run_dir, _log()), resume_step=2)
  assert [r['step'] for r in _jsonl(run_dir)] == list(range(6))
  records = tracking.offline_records(run_dir)
  assert_equal_streams(tracking.history(records), _jsonl(run_dir))
  runs = [r['run'] for r in records if r['type'] == 'run']
  assert [r['run_id'] for r in runs] == [first_id, first_id]
  # Known negative: another project is another W&B run, which gets every record again.
  _write(run_dir, [6], tracker=_start(run_dir, _log(wandb_project='other')), resume_step=6)
  state = json.load(open(os.path.join(run_dir, 'wandb', tracking.STATE_FILE)))
  assert state['id'] != first_id
  assert_equal_streams(tracking.offline_history(run_dir, state['id']), _jsonl(run_dir))


KILLED = """
import os, signal, sys
from configs import common
from jtc.analysis import metric_writer, tracking
log, run_dir, records = common.get_config().log, sys.argv[1], eval(sys.argv[2])
log.wandb_project = 'jtc-tests'
tracker, = tracking.start_runs(log, [run_dir], revision=lambda: 'rev', workdir=run_dir)
writer = metric_writer.MetricWriter(run_dir, resume_step=3, tracker=tracker)
for step, record in records:
  writer.write(step, record)
os.kill(os.getpid(), signal.SIGKILL)
"""


# CI time: tests/rl/test_trainer.py's SIGKILL-and-resume run checks the same W&B records.
@pytest.mark.slow
def test_steps_a_sigkill_lost_are_logged_at_the_resume(offline, tmp_path):
  """Steps 0-2 logged and finished; a resumed start logs 3-5 and is killed (wandb's service has
  written little or none of them); the next resume, from step 4, logs the steps the W&B run
  lacks from metrics.jsonl and never the ones it holds."""
  run_dir = _run_dir(tmp_path / 'run', {'seed': 0})
  _write(run_dir, range(3), tracker=_start(run_dir, _log()))
  records = repr([(step, _record(step)) for step in range(3, 6)])
  proc = subprocess.run([sys.executable, '-c', KILLED, run_dir, records], cwd=REPO,
                        capture_output=True, text=True, timeout=300, env=offline)
  assert proc.returncode == -9, proc.stderr[-2000:]
  _write(run_dir, range(4, 6), tracker=_start(run_dir, _log()), resume_step=4)
  assert [r['step'] for r in _jsonl(run_dir)] == list(range(6))
  assert_equal_streams(tracking.offline_history(run_dir), _jsonl(run_dir))


def test_nothing_starts_when_wandb_is_off(offline, tmp_path, monkeypatch):
  run_dir = _run_dir(tmp_path / 'run', {'seed': 0})
  start = lambda log: tracking.start_runs(log, [run_dir], revision=None, workdir=run_dir)
  assert start(_log(wandb_project='')) == [None]
  assert start(_log(wandb_mode='disabled')) == [None]
  monkeypatch.setenv('WANDB_MODE', 'disabled')
  assert start(_log()) == [None]
  assert not os.path.exists(os.path.join(run_dir, 'wandb'))


def test_population_members_are_grouped_runs_with_their_own_streams(offline, tmp_path):
  workdir = tmp_path / 'pop'
  dirs = [_run_dir(workdir / 'members' / f'seed{k}', {'seed': k}) for k in range(2)]
  trackers = tracking.start_runs(_log(), dirs, revision=lambda: 'rev-2', workdir=str(workdir))
  for d, tracker, scale in zip(dirs, trackers, (1.0, -3.0)):
    _write(d, range(3), tracker=tracker, scale=scale)
  runs = []
  for d in dirs:
    records = tracking.offline_records(d)
    assert_equal_streams(tracking.history(records), _jsonl(d))
    runs += [r['run'] for r in records if r['type'] == 'run']
  assert [r['display_name'] for r in runs] == ['pop/seed0', 'pop/seed1']
  assert [r['run_group'] for r in runs] == ['pop', 'pop']
  assert runs[0]['run_id'] != runs[1]['run_id']
  assert [r['config']['update']['seed'] for r in runs] == [0, 1]
  assert _jsonl(dirs[0])[1]['loss'] != _jsonl(dirs[1])[1]['loss']  # two streams, not one


def test_the_mode_follows_the_credentials_and_online_needs_them(tmp_path):
  netrc = tmp_path / 'netrc'
  netrc.write_text('machine api.wandb.ai login user password k3y\n')
  none = {'NETRC': str(tmp_path / 'absent')}
  assert tracking.resolve_mode('', none) == 'offline'
  assert tracking.resolve_mode('', dict(none, WANDB_API_KEY='k')) == 'online'
  assert tracking.resolve_mode('', {'NETRC': str(netrc)}) == 'online'
  other_host = {'NETRC': str(netrc), 'WANDB_BASE_URL': 'https://wandb.example.org'}
  assert tracking.resolve_mode('', other_host) == 'offline'  # a key for another server
  assert tracking.resolve_mode('', dict(none, WANDB_MODE='disabled')) == 'disabled'
  assert tracking.resolve_mode('offline', dict(none, WANDB_API_KEY='k')) == 'offline'
  with pytest.raises(ValueError, match=r"wandb_mode='online' but no W&B API key"):
    tracking.resolve_mode('online', none)
  with pytest.raises(ValueError, match=r"WANDB_MODE='online' but no W&B API key"):
    tracking.resolve_mode('', dict(none, WANDB_MODE='online'))
  with pytest.raises(ValueError, match=r"\$WANDB_MODE='sometimes' is not valid; valid: "):
    tracking.resolve_mode('', dict(none, WANDB_MODE='sometimes'))


@pytest.mark.parametrize('keys, match', [
    ({
        'wandb_mode': 'onlin'
    }, r"config.log.wandb_mode='onlin' is not valid; valid: \['', "),
    ({
        'wandb_mode': 'online'
    }, r"config.log.wandb_mode='online' but no W&B API key"),
])
def test_bad_keys_are_named_before_compute(offline, tmp_path, keys, match):
  c = common.get_config('smoke')
  c.log.update(_log(**keys))
  with pytest.raises(ValueError, match=match):
    config_check.validate(c)
  c.log.wandb_project = ''  # W&B off: its mode is still checked, its credentials are not
  if keys['wandb_mode'] == 'online':
    config_check.validate(c)


def test_a_missing_package_names_the_extra_before_anything_runs(offline, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # `import wandb` fails, find_spec finds none
  assert not tracking.installed()
  c = common.get_config('smoke')
  c.log.wandb_project = 'jtc-tests'
  workdir = tmp_path / 'w'
  with pytest.raises(
      ValueError,
      match=r'needs the wandb package.*pip install -e "\.\[wandb\]" in the jtc checkout'):
    trainer_lib.Trainer(c, str(workdir))
  assert not workdir.exists()
  # Known negatives: another process of a multi-process run never logs, and W&B not asked for.
  tracking.check_config(c.log, primary=False)
  c.log.wandb_mode = 'disabled'
  config_check.validate(c)


def test_importing_jtc_does_not_import_wandb():
  code = ('import sys, jtc, jtc.cli.train, jtc.rl.trainer, jtc.analysis.tracking; '
          'assert "wandb" not in sys.modules, "wandb imported"; '
          'import jtc.analysis.tracking as t; assert t.installed()')
  proc = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 0, proc.stderr[-2000:]
