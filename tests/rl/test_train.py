"""The RL trainer: config checks, an end-to-end smoke run, SIGKILL + resume, corrupt checkpoints.

The runs start from a freshly initialised tiny policy bundle (the shipped base policy is tested
in tests/rl/test_base_policy.py); they check the mechanics, not learning.
"""

import glob
import importlib
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import procs
from configs import common
from jtc.models import bundles
from jtc import checks
from jtc.rl import cli
from jtc.rl import config_check
from jtc.analysis import metric_writer
from jtc.models import model as model_lib
from jtc.analysis import plot
from jtc.models import tokenizer as tokenizer_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = cli.methods()
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


def _config(method, arg='smoke'):
  return importlib.import_module(f'configs.{method}').get_config(arg)


def test_every_method_has_a_config():
  expected = {
      'grpo', 'dapo', 'dr_grpo', 'gspo', 'dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj',
      'grpo_fix', 'delta', 'sapo', 'cispo'
  }
  assert expected <= set(METHODS)


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('arg', [None, 'smoke', 'runlocal'])
def test_method_configs_validate(method, arg):
  c = _config(method, arg)
  config_check.validate(c)
  assert c.loss.name == method
  doc = importlib.import_module(f'configs.{method}').__doc__
  assert f'configs/{method}.py' in doc  # the docstring carries the run command


@pytest.mark.parametrize('key,value,needle', [
    ('rollout.sampling.num_samples', 1, 'num_samples'),
    ('loss.hparams.eps_high', 0.0, 'eps_high'),
    ('loss.hparams.eps_low', -0.1, 'eps_low'),
    ('optim.minibatch_prompts', 3, 'minibatch_prompts'),
    ('delta.lam_min', 1.5, 'lam_min'),
    ('loss.name', 'ppo_typo', 'loss.name'),
    ('token_weights', 'delta', 'token_weights'),
    ('advantage.name', 'gae', 'advantage'),
    ('data.task', 'chess', 'task'),
    ('num_steps', 0, 'num_steps'),
    ('dapo.overlong_buffer', 100, 'overlong_buffer'),
    ('eval.every', -5, 'eval.every'),
    ('optim.grad_clip', -1.0, 'grad_clip'),
    ('optim.weight_decay', -1.0, 'weight_decay'),
    ('optim.adam_b2', 1.5, 'adam_b2'),
    ('loss.hparams.kl_coef', -1.0, 'kl_coef'),
    ('log.keep_checkpoints', 0, 'keep_checkpoints'),
    ('rollout.sampling.top_p', 0.0, 'top_p'),
    ('rollout.sampling.top_k', -1, 'top_k'),
    ('eval.sampling.min_p', 1.5, 'min_p'),
])
def test_invalid_settings_fail_naming_the_key(key, value, needle):
  c = _config('delta' if key.startswith('delta.') else 'dapo', None)
  with c.unlocked():
    node = c
    *parents, leaf = key.split('.')
    for p in parents:
      node = node[p]
    node[leaf] = value
  with pytest.raises(ValueError, match=needle):
    config_check.validate(c)


_METHOD_KEYS = ('loss.', 'delta.', 'token_weights', 'advantage.')  # Dr. GRPO: advantage


@pytest.mark.parametrize('family', ['configs', 'configs.real'])
def test_method_configs_differ_only_in_the_method(family):
  """A comparison between two method configs compares methods: every other key is equal."""
  folder = os.path.join(REPO, *family.split('.'))
  names = sorted(
      os.path.basename(p)[:-3]
      for p in glob.glob(os.path.join(folder, '*.py'))
      if os.path.basename(p) not in ('__init__.py', 'common.py',
                                     'base.py') and not os.path.basename(p).startswith('sft_'))
  if family == 'configs.real':  # one model and dataset per family of real configs
    names = [n for n in names if n.startswith('qwen3_8b_math')]
  flat = {
      n: checks.flatten(importlib.import_module(f'{family}.{n}').get_config(None).to_dict())
      for n in names
  }
  differing = {}
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      keys = sorted(k for k in set(flat[a]) | set(flat[b])
                    if flat[a].get(k) != flat[b].get(k) and not k.startswith(_METHOD_KEYS))
      if keys:
        differing[f'{a} vs {b}'] = keys
  assert len(names) >= 2
  assert not differing, differing


def test_set_loss_rejects_unknown_hparam():
  c = common.get_config()
  with pytest.raises(ValueError, match='not_a_knob'):
    common.set_loss(c, 'gspo', not_a_knob=1.0)


def test_config_arg_typo_is_rejected():
  with pytest.raises(ValueError, match='smok'):
    _config('grpo', 'smok')


def _cmd(workdir, policy, *extra, method='dfpo_min_replace'):
  return [
      sys.executable, '-m', 'jtc.train', f'--config=configs/{method}.py:smoke',
      f'--workdir={workdir}', f'--config.policy.init={policy}', '--config.num_steps=3', *extra
  ]


def _run(workdir, policy, *extra, method='dfpo_min_replace', check=True):
  cmd = _cmd(workdir, policy, *extra, method=method)
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  proc = procs.run(cmd, f'{workdir.rstrip(os.sep)}.stderr.log', cwd=REPO, env=env)
  if check and proc.returncode != 0:
    raise AssertionError(proc)
  return proc


def _comparable(records):
  return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)} for r in records]


@pytest.fixture(scope='module')
def uninterrupted(tiny_policy, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run_a'))
  _run(workdir, tiny_policy)
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


def test_sigkill_then_resume_equals_uninterrupted(uninterrupted, tiny_policy, tmp_path):
  workdir = str(tmp_path)
  ended = procs.kill_after_checkpoint(_cmd(workdir, tiny_policy), workdir, 1, cwd=REPO,
                                      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert ended.returncode == -9, ended
  killed = [r['step'] for r in metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]
  assert killed[:2] == [0, 1] and killed[-1] < 3, killed
  proc = _run(workdir, tiny_policy)
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


def test_plot_draws_several_runs(uninterrupted, tmp_path):
  out = plot.plot_runs([uninterrupted, uninterrupted], str(tmp_path / 'curves.png'))
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


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


def test_unknown_config_key_on_the_command_line_fails_before_compute(tmp_path):
  proc = subprocess.run([
      sys.executable, '-m', 'jtc.train', '--config=configs/grpo.py:smoke', f'--workdir={tmp_path}',
      '--config.not_a_key=1'
  ], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert 'not_a_key' in proc.stderr
  assert not os.path.exists(os.path.join(tmp_path, 'metrics.jsonl'))
