"""Tests of jtc.rl.config_check: every method config validates, and an invalid setting fails
naming its key before any compute."""
import importlib

import pytest

from jtc.cli import train as train_cli
from jtc.rl import config_check

METHODS = train_cli.methods()


def _config(method, arg='smoke'):
  return importlib.import_module(f'configs.{method}').get_config(arg)


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
    ('delta.hidden', 'kept', r"delta.hidden='kept' is not valid; valid: \['held', 'recomputed'\]"),
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


def test_the_loaded_policy_checks_lora_and_moe_keys():
  """validate_policy: LoRA's rank against the model and a mixture of experts' keys (jtc.rl.routing,
  tested there) once the policy is known."""
  from configs import common  # pylint: disable=import-outside-toplevel
  from jtc.models.model_config import ModelConfig  # pylint: disable=import-outside-toplevel
  c = common.get_config()
  config_check.validate_policy(c, ModelConfig.tiny())
  c.mesh.expert = 3
  with pytest.raises(ValueError, match='mesh.expert=3 must divide'):
    config_check.validate_policy(c, ModelConfig.tiny_moe())
