"""The base policy shipped in jtc/assets/base_policy loads and scores within its stated band.

Band (issue 4): held-out accuracy between 20% and 70% when sampling at temperature 1, so a
group of G samples holds both correct and incorrect answers, with every solution format present.
"""

import os

import jax
import pytest

from configs import sft_arith
from jtc import checkpoints
from jtc import data as data_lib
from jtc import model as model_lib
from jtc import rollout
from jtc import sft
from jtc import tasks as tasks_lib


def test_shipped_bundle_is_small():
  total = sum(os.path.getsize(os.path.join(checkpoints.BASE_POLICY_DIR, f))
              for f in os.listdir(checkpoints.BASE_POLICY_DIR))
  assert total <= 20 * 2**20


@pytest.fixture(scope='module')
def base_eval(tmp_path_factory):
  bundle = checkpoints.load_policy_bundle('base')
  c = sft_arith.get_config()
  task = tasks_lib.get_task(c.task)
  test = data_lib.load_examples(c.task, split='test',
                                data_dir=str(tmp_path_factory.mktemp('data')), limit=96)
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=c.prompt_width)
  result = rollout.evaluate(gen, bundle.params, test, jax.random.key(123),
                            sampling=sft.eval_sampling(4, c.max_new_tokens), batch_prompts=32,
                            task=task)
  return bundle, task, result


def test_base_policy_accuracy_in_band(base_eval):
  _, _, result = base_eval
  assert 0.2 <= result['avg@4'] <= 0.7, result


def test_base_policy_writes_every_format(base_eval):
  _, task, result = base_eval
  for f in task.formats:
    assert result[f'format/{f}'] > 0.05, result


def test_stated_accuracy_matches_a_fresh_measurement(base_eval):
  bundle, _, result = base_eval
  stated = bundle.meta['eval']['avg@4']
  # 96 problems x 4 samples here vs 256 x 4 at build time: allow ~4 standard errors.
  assert abs(result['avg@4'] - stated) < 0.15, (result, stated)


def test_bundle_round_trip(tmp_path):
  bundle = checkpoints.load_policy_bundle('base')
  path = str(tmp_path / 'copy')
  checkpoints.save_policy_bundle(path, model_config=bundle.model_config, params=bundle.params,
                                 tokenizer_spec=bundle.tokenizer_spec, meta=bundle.meta)
  again = checkpoints.load_policy_bundle(path)
  assert again.model_config == bundle.model_config
  assert model_lib.num_params(again.params) == model_lib.num_params(bundle.params)
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(bundle.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_not_a_bundle_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='not a policy bundle'):
    checkpoints.load_policy_bundle(str(tmp_path))
