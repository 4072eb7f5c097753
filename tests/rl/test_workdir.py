"""A user's runs are never lost or silently mixed (issue 15): one run per workdir, locked;
resume only into the same config; incompatible checkpoints refused, unreadable ones moved aside;
every step exactly once in every output; Ctrl-C checkpoints; bad input named before compute."""

import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest

from configs import common
from jtc import checks
from jtc.models import bundles
from jtc.analysis import metric_writer
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NONDETERMINISTIC = ('time_', 'tokens_per_s')


def _bundle(path, n_layers):
  spec = {'kind': 'char'}
  config = model_lib.ModelConfig.tiny(vocab_size=tokenizer_lib.from_spec(spec).vocab_size,
                                      n_layers=n_layers)
  bundles.save_policy_bundle(path, model_config=config,
                             params=model_lib.init_params(config,
                                                          jax.random.key(0)), tokenizer_spec=spec)
  return path


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
  return _bundle(str(tmp_path_factory.mktemp('policy') / 'bundle'), n_layers=2)


def _cmd(workdir, policy, *extra, method='gspo', steps=3):
  return [
      sys.executable, '-m', 'jtc.train', f'--config=configs/{method}.py:smoke',
      f'--workdir={workdir}', f'--config.policy.init={policy}', f'--config.num_steps={steps}',
      '--config.log.diagnostics_every=0', *extra
  ]


def _run(*args, check=True, **kw):
  proc = subprocess.run(_cmd(*args, **kw), cwd=REPO, env=dict(os.environ, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=600)
  if check and proc.returncode:
    raise AssertionError(proc.stderr[-3000:])
  return proc


def _steps(workdir):
  return [r['step'] for r in metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]


def _comparable(workdir):
  return [{
      k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)
  } for r in metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]


@pytest.fixture(scope='module')
def finished(policy, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('finished'))
  _run(workdir, policy)
  return workdir


def test_a_workdir_of_another_config_is_refused_naming_the_keys(finished, policy, tmp_path):
  workdir = str(tmp_path / 'w')
  shutil.copytree(finished, workdir)
  before = open(os.path.join(workdir, 'metrics.jsonl')).read()
  proc = _run(workdir, policy, '--config.optim.learning_rate=0.5', method='dfpo_min_replace',
              steps=5, check=False)
  assert proc.returncode != 0
  msg = proc.stderr.strip().splitlines()[-1]
  assert msg.startswith('error:') and 'loss.name' in msg and 'optim.learning_rate' in msg
  assert open(os.path.join(workdir, 'metrics.jsonl')).read() == before
  # num_steps may change on resume; the schedule keeps its original length (and says so).
  proc = _run(workdir, policy, steps=4)
  assert 'keeps its original length (3 steps)' in proc.stderr
  assert _steps(workdir) == [0, 1, 2, 3, 4]


def test_identity_allows_only_resumable_keys():
  c = common.get_config('smoke')
  d = ml_collections.ConfigDict(c.to_dict())
  with d.unlocked():
    d.num_steps, d.log.ckpt_every = 7, 5
  import tempfile  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as w:
    assert workdir_lib.check_identity(w, c, has_checkpoint=False) == c.num_steps
    with pytest.raises(workdir_lib.WorkdirError, match='no config.json'):
      workdir_lib.check_identity(w, c, has_checkpoint=True)
    workdir_lib.record_config(w, c, c.num_steps)
    assert workdir_lib.check_identity(w, d, has_checkpoint=True) == c.num_steps
    with d.unlocked():
      d.seed = 1
    with pytest.raises(workdir_lib.WorkdirError, match=r'seed: 0 -> 1'):
      workdir_lib.check_identity(w, d, has_checkpoint=True)
    assert workdir_lib.check_identity(w, d, has_checkpoint=True, allow_changes=True) == 2


def test_a_run_recorded_before_the_verifier_pool_keys_resumes(tmp_path):
  """data.verify_workers / verify_timeout_s are absent from older workdirs' config.json and may
  change on resume; data.reward may not (known positive)."""
  c = common.get_config('smoke')
  old = ml_collections.ConfigDict(c.to_dict())
  with old.unlocked():
    del old.data['verify_workers']
    del old.data['verify_timeout_s']
  workdir_lib.record_config(str(tmp_path), old, c.num_steps)
  with c.unlocked():
    c.data.verify_workers, c.data.verify_timeout_s = 16, 30.0
  assert workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True) == c.num_steps
  with c.unlocked():
    c.data.reward = 'math_verify'
  with pytest.raises(workdir_lib.WorkdirError, match=r"data.reward: '' -> 'math_verify'"):
    workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True)


def test_a_run_recorded_before_the_added_keys_resumes(tmp_path):
  """A config.json recorded before the keys of ADDED_KEYS existed (mesh.expert, the dataset
  split and overlong keys, ...) resumes: they ran at those values, today's defaults; another
  value is refused (known positive)."""
  c = common.get_config('smoke')
  flat = checks.flatten(c.to_dict())
  assert {k: flat[k] for k in workdir_lib.ADDED_KEYS} == workdir_lib.ADDED_KEYS
  old = ml_collections.ConfigDict(c.to_dict())
  with old.unlocked():
    for key in workdir_lib.ADDED_KEYS:
      section, leaf = key.rsplit('.', 1)
      del old[section][leaf]
  workdir_lib.record_config(str(tmp_path), old, c.num_steps)
  assert workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True) == c.num_steps
  with c.unlocked():
    c.mesh.expert = 2
  with pytest.raises(workdir_lib.WorkdirError, match=r'mesh.expert: 1 -> 2'):
    workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True)


def test_a_run_recorded_with_a_removed_key_at_its_only_value_resumes(tmp_path):
  """lora.dropout (removed: only 0 was ever accepted) in an older config.json does not stop a
  resume; known positive: a recorded 0.1, which no run of this version reproduces, does."""
  c = common.get_config('smoke')
  for dropout, resumes in ((0.0, True), (0.1, False)):
    old = ml_collections.ConfigDict(c.to_dict())
    with old.unlocked():
      old.lora.dropout = dropout
    workdir_lib.record_config(str(tmp_path), old, c.num_steps)
    if resumes:
      assert workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True) == c.num_steps
    else:
      with pytest.raises(workdir_lib.WorkdirError, match=r"lora.dropout: 0.1 -> '\(absent\)'"):
        workdir_lib.check_identity(str(tmp_path), c, has_checkpoint=True)


def _files(workdir):
  return {
      p: open(p, 'rb').read()
      for p in glob.glob(os.path.join(workdir, '**', '*'), recursive=True)
      if os.path.isfile(p) and not p.endswith(workdir_lib.LOCK_FILE)
  }


@pytest.mark.slow  # ~30 s
def test_checkpoints_of_another_model_are_refused_not_deleted(tmp_path):
  """The policy bundle behind the same path was rebuilt smaller: incompatible != unreadable."""
  bundle = _bundle(str(tmp_path / 'policy'), n_layers=2)
  workdir = str(tmp_path / 'w')
  _run(workdir, bundle, steps=2)
  _bundle(bundle, n_layers=1)
  before = _files(workdir)
  proc = _run(workdir, bundle, steps=3, check=False)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert 'does not fit this run' in last and 'Nothing was changed' in last
  assert 'has shape' in last  # stacked layers: the leading layer axis names the difference
  assert _files(workdir) == before


@pytest.mark.slow  # 40 s of trainer runs
def test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_run_finishes(
    finished, policy, tmp_path):
  workdir = str(tmp_path / 'w')
  shutil.copytree(finished, workdir)
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  steps = sorted(int(s) for s in os.listdir(ckpt_dir) if s.isdigit())
  for path in glob.glob(os.path.join(ckpt_dir, str(steps[-1]), '**', '*'), recursive=True):
    if os.path.isfile(path):
      with open(path, 'wb') as f:
        f.write(b'\0garbage')
  proc = _run(workdir, policy)
  warning = [l for l in proc.stderr.splitlines() if 'unreadable' in l]
  assert len(warning) == 1 and f'checkpoint step {steps[-1]}' in warning[0]
  assert os.listdir(os.path.join(ckpt_dir, 'unreadable'))[0].startswith(f'{steps[-1]}-')
  assert os.path.isdir(os.path.join(ckpt_dir, str(steps[-1])))  # recomputed and saved again
  assert _steps(workdir) == [0, 1, 2, 3]
  for a, b in zip(_comparable(workdir), _comparable(finished)):
    for k in a:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow  # 80 s of trainer runs
def test_metrics_without_checkpoints_are_replaced_not_duplicated(finished, policy, tmp_path):
  """Killed before the first checkpoint: the run restarts from 0 and every step appears once."""
  workdir = str(tmp_path / 'w')
  os.makedirs(workdir)
  shutil.copy(os.path.join(finished, 'config.json'), workdir)
  lines = open(os.path.join(finished, 'metrics.jsonl')).readlines()
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(lines[:2])
  _run(workdir, policy)
  assert _steps(workdir) == [0, 1, 2, 3]


def test_two_trainers_on_one_workdir_the_second_is_refused(policy, tmp_path):
  workdir = str(tmp_path / 'w')
  os.makedirs(workdir)
  holder = subprocess.Popen([
      sys.executable, '-c', 'import sys, time; from jtc.rl import workdir; '
      f'l = workdir.lock({workdir!r}); print("locked", flush=True); time.sleep(60)'
  ], cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    proc = _run(workdir, policy, check=False)
    assert proc.returncode != 0
    assert f'is in use by pid {holder.pid}' in proc.stderr.strip().splitlines()[-1]
    assert not os.path.exists(os.path.join(workdir, 'metrics.jsonl'))
  finally:
    holder.kill()


@pytest.mark.slow  # a trainer stopped by a signal; SIGKILL resume is in CI (tests/rl/test_trainer.py)
def test_sigint_writes_a_checkpoint_and_exits_with_one_line(policy, tmp_path):
  workdir = str(tmp_path / 'w')
  proc = subprocess.Popen(_cmd(workdir, policy, '--config.log.ckpt_every=1000',
                               steps=1000), cwd=REPO, env=dict(os.environ, JAX_PLATFORMS='cpu'),
                          stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while time.time() < deadline and max(_steps(workdir) or [0]) < 2:
    time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
  assert 'Traceback' not in err
  stopped = [l for l in err.splitlines() if l.startswith('SIGINT at step')]
  assert len(stopped) == 1
  step = int(stopped[0].split()[3].rstrip(':'))
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', str(step)))
  assert _steps(workdir)[-1] == step
  resumed = _run(workdir, policy, '--config.log.ckpt_every=1000', steps=step + 1)
  assert f'resumed from step {step}' in resumed.stderr
  assert _steps(workdir) == list(range(step + 2))


@pytest.mark.slow  # a trainer run to its token budget
def test_a_token_budget_stop_is_checkpointed_evaluated_and_final(policy, tmp_path):
  """A run that ends on its token budget keeps its last step: checkpoint and evaluation there,
  and running it again says it is finished instead of redoing the steps."""
  workdir = str(tmp_path / 'w')
  proc = _run(workdir, policy, '--config.token_budget=1', '--config.log.ckpt_every=1000')
  assert 'token budget 1 reached at step 1' in proc.stderr
  records = metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1]
  assert any(k.startswith('eval/') for k in records[-1])
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '1'))
  again = _run(workdir, policy, '--config.token_budget=1', '--config.log.ckpt_every=1000')
  assert 'already finished' in again.stderr and _steps(workdir) == [0, 1]


def test_a_finished_run_says_so_and_logs_progress_lines(finished, policy):
  proc = _run(finished, policy)
  assert 'already finished' in proc.stderr and '"step": 3' in proc.stdout


@pytest.mark.slow  # 40 s of trainer runs
def test_relative_config_paths_work_from_any_directory(policy, tmp_path):
  workdir = str(tmp_path / 'w')
  proc = subprocess.run(_cmd(workdir, policy,
                             steps=1), cwd=str(tmp_path), env=dict(os.environ, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'step 1/1 reward' in proc.stderr  # a progress line: stderr is not a terminal


def test_a_released_lock_leaves_no_file_and_a_lock_on_a_removed_file_is_retried(
    tmp_path, monkeypatch):
  """The workdir's .lock goes with its lock; a trainer that opened the file just before its
  holder removed it, and locked it just after, locks the path's new file, not the removed one."""
  workdir = str(tmp_path / 'w')
  os.makedirs(workdir)
  path = os.path.join(workdir, workdir_lib.LOCK_FILE)
  held = workdir_lib.lock(workdir)
  assert open(path).read() == f'pid {os.getpid()}'
  with pytest.raises(workdir_lib.WorkdirError, match=f'in use by pid {os.getpid()}'):
    workdir_lib.lock(workdir)  # another open file description: refused as another process is
  held.close()
  held.close()  # idempotent
  assert not os.path.exists(path)
  flock, calls = fcntl.flock, []

  def holder_lets_go_first(f, op):  # between this trainer's open and its flock
    calls.append(os.fstat(f.fileno()).st_ino)
    if len(calls) == 1:
      os.remove(path)
    return flock(f, op)

  monkeypatch.setattr(workdir_lib.fcntl, 'flock', holder_lets_go_first)
  again = workdir_lib.lock(workdir)
  monkeypatch.undo()
  assert len(calls) == 2 and open(path).read() == f'pid {os.getpid()}'  # locked the new file
  with pytest.raises(workdir_lib.WorkdirError):
    workdir_lib.lock(workdir)  # the path's file is held
  again.close()
  assert os.listdir(workdir) == []
