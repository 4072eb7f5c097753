"""The RL trainer (jtc.rl.trainer): an end-to-end smoke run (its sample generations too), SIGKILL +
resume equal to an uninterrupted run, diagnostics measured off-policy.

The runs start from a freshly initialised tiny policy bundle (the shipped base policy is tested
in tests/rl/test_base_policy.py); they check the mechanics, not learning.
"""
import glob
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from tests import procs

from jtc.models import bundles
from jtc.analysis import metric_writer
from jtc.models import model as model_lib
from jtc.analysis import curve_plots
from jtc.analysis import samples
from jtc.analysis import tracking
from jtc.rl import distributed
from jtc.models import tokenizer as tokenizer_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NONDETERMINISTIC = ('time_', 'tokens_per_s')


@pytest.fixture(scope='module')
def tiny_policy(tmp_path_factory):
  """A random tiny policy bundle with the character tokenizer."""
  spec = {'kind': 'char'}
  tok = tokenizer_lib.from_spec(spec)
  config = model_lib.ModelConfig.tiny(vocab_size=tok.vocab_size)
  params = model_lib.init_params(config, jax.random.key(0))
  path = str(tmp_path_factory.mktemp('policy') / 'bundle')
  bundles.save_policy_bundle(path, model_config=config, params=params, tokenizer_spec=spec)
  return path


def _cmd(workdir, policy, *extra, method='dfpo_min_replace'):
  return [
      sys.executable, '-m', 'jtc.train', f'--config=configs/{method}.py:smoke',
      f'--workdir={workdir}', f'--config.policy.init={policy}', '--config.num_steps=3', *extra
  ]


def _run(workdir, policy, *extra, method='dfpo_min_replace', check=True, env=None):
  cmd = _cmd(workdir, policy, *extra, method=method)
  env = dict(env or os.environ, JAX_PLATFORMS='cpu')
  proc = procs.run(cmd, f'{workdir.rstrip(os.sep)}.stderr.log', cwd=REPO, env=env)
  if check and proc.returncode != 0:
    raise AssertionError(proc)
  return proc


def _comparable(records):
  return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)} for r in records]


@pytest.fixture(scope='module')
def uninterrupted(tiny_policy, tmp_path_factory):
  """The smoke run, logged to an offline W&B run too (jtc.analysis.tracking)."""
  workdir = str(tmp_path_factory.mktemp('run_a'))
  env = procs.offline_wandb_env(str(tmp_path_factory.mktemp('wandb_env')))
  _run(workdir, tiny_policy, '--config.log.wandb_project=jtc-tests', env=env)
  return workdir


def test_smoke_run_writes_metrics_checkpoints_and_tensorboard(uninterrupted):
  records = metric_writer.read_jsonl(os.path.join(uninterrupted, 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1, 2, 3]
  for key in ('reward_mean', 'accuracy', 'adv/frac_zero_std', 'entropy', 'asym', 'approx_kl',
              'clip_frac_low', 'clip_frac_high', 'ratio_mean', 'grad_norm', 'param_norm',
              'tokens_per_s', 'time_sample', 'time_score', 'time_update',
              'compute/generated_tokens', 'compute/update_steps'):
    assert key in records[1], key
  assert 'eval/avg@2' in records[0] and 'eval/avg@2' in records[-1]
  # Compute accounting is cumulative and consistent with the config (2 prompts x 4 samples).
  assert records[-1]['compute/rollouts'] == 3 * 2 * 4
  assert records[-1]['compute/update_steps'] == 3 * 2
  assert glob.glob(os.path.join(uninterrupted, 'tensorboard', 'events.*'))
  assert os.path.isdir(os.path.join(uninterrupted, 'checkpoints', '3'))
  # Sample generations every step (the smoke config's log.samples_every=1): one completion of
  # each of the step's 2 prompts, scored as the step's rewards were.
  got = samples.read(uninterrupted)
  assert [r['step'] for r in got] == [1, 1, 2, 2, 3, 3]
  assert all(r['prompt'] and r['answer'] and r['reward'] in (0.0, 1.0) for r in got)


def test_the_wandb_run_holds_the_records_of_metrics_jsonl(uninterrupted):
  """Read back with wandb's own reader: the same records at the same steps, the run's config
  and the code revision."""
  records = tracking.offline_records(uninterrupted)
  jsonl = metric_writer.read_jsonl(os.path.join(uninterrupted, 'metrics.jsonl'))
  logged = tracking.history(records)
  assert [r['step'] for r in logged] == [r['step'] for r in jsonl] == [0, 1, 2, 3]
  for got, want in zip(logged, jsonl):
    assert got == {'step': want['step'], **tracking.for_wandb(want)}
  run, = [r['run'] for r in records if r['type'] == 'run']
  config = run['config']['update']
  assert config['code_revision'] == distributed.code_revision()
  assert config['loss']['name'] == 'dfpo_min_replace' and config['num_steps'] == 3
  assert run['display_name'] == os.path.basename(uninterrupted)
  tables = tracking.offline_tables(uninterrupted, samples.TABLE)
  assert [row for t in tables for row in t['data']
         ] == [[r[k] for k in samples.COLUMNS] for r in samples.read(uninterrupted)]


def test_sigkill_then_resume_equals_uninterrupted(uninterrupted, tiny_policy, tmp_path):
  """The run killed after its step-1 checkpoint and resumed, with W&B on: metrics.jsonl equals
  the uninterrupted run's, and the W&B run (one id over both starts) holds each of its records
  once, the ones the kill kept wandb's service from writing included."""
  workdir = str(tmp_path / 'run')
  env = dict(procs.offline_wandb_env(str(tmp_path / 'wandb_env')), JAX_PLATFORMS='cpu')
  wandb = '--config.log.wandb_project=jtc-tests'
  ended = procs.kill_after_checkpoint(_cmd(workdir, tiny_policy, wandb), workdir, 1, cwd=REPO,
                                      env=env)
  assert ended.returncode == -9, ended
  killed = [r['step'] for r in metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]
  assert killed[:2] == [0, 1] and killed[-1] < 3, killed
  proc = _run(workdir, tiny_policy, wandb, env=env)
  resumed_at = int(re.search(r'resumed from step (\d+) \(optimiser step (\d+)\)', proc.stderr)[1])
  assert 1 <= resumed_at < 3
  resumed = metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  reference = metric_writer.read_jsonl(os.path.join(uninterrupted, 'metrics.jsonl'))
  a, b = _comparable(resumed), _comparable(reference)
  assert [r['step'] for r in a] == [r['step'] for r in b]
  for ra, rb in zip(a, b):
    assert ra.keys() == rb.keys()
    for k in ra:
      np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  records = tracking.offline_records(workdir)
  assert tracking.history(records) == [{
      'step': r['step'],
      **tracking.for_wandb(r)
  } for r in resumed]
  assert len({r['run']['run_id'] for r in records if r['type'] == 'run'}) == 1
  # Each step's samples once, as the uninterrupted run's.
  assert samples.read(workdir) == samples.read(uninterrupted)


def test_plot_draws_several_runs(uninterrupted, tmp_path):
  out = curve_plots.plot_runs([uninterrupted, uninterrupted], str(tmp_path / 'curves.png'))
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow  # two trainers; the diagnostics' off-policy contrast is in CI at the step level
def test_diagnostics_are_measured_off_policy_and_tell_gspo_from_dfpo(tmp_path):
  """Known-positive control of the trainer's diagnostics: same seed, same rollouts, step 1 of
  GSPO and of DFPO (Min-Replace) with 2 updates per step. The diagnostics come from the second
  mini-batch (off-policy), so they differ between the methods (they used to be measured before
  the update, where they are bit-identical); GSPO leaves a shared-token residual, DFPO does not.
  The per-token weight is 1/(B T) (seq_mean_token_sum_norm) so that cancellation is exact: with
  the default 1/|y_i| it holds only for equal lengths (paper Eq. 72)."""
  out = {}
  for method in ('gspo', 'dfpo_min_replace'):
    workdir = str(tmp_path / method)
    _run(workdir, 'base', '--config.num_steps=1', '--config.rollout.prompts_per_step=8',
         '--config.optim.minibatch_prompts=4', '--config.log.diagnostics_every=1',
         '--config.rollout.sampling.max_new_tokens=16', '--config.eval.every=100',
         '--config.loss.hparams.aggregation=seq_mean_token_sum_norm', method=method)
    out[method] = metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))[-1]
  gspo, dfpo = out['gspo'], out['dfpo_min_replace']
  assert gspo['diag/off_policy_points'] == dfpo['diag/off_policy_points'] == 1
  assert gspo['reward_mean'] == dfpo['reward_mean']  # the same rollouts
  assert gspo['diag/shared_frac'] == dfpo['diag/shared_frac'] > 0
  assert gspo['diag/shared_residual'] > 1e-3
  assert dfpo['diag/shared_residual'] < 1e-5
  assert gspo['diag/coef_mass_vs_gspo'] == pytest.approx(1.0)
  assert dfpo['diag/coef_mass_vs_gspo'] != pytest.approx(1.0, abs=1e-4)
