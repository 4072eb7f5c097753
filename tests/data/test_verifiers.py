"""Which verifier a run scores with (jtc.data.verifiers): data.reward by name or a user's
function, per data_source as data.reward_by_source says (a source it does not name scores with
data.reward), and a name that is none of them refused before any compute."""
import ml_collections
import numpy as np
import pytest

from configs import common
from jtc.data import examples
from jtc.data import verifiers


def data(**keys):
  c = common.get_config()
  with c.unlocked():
    c.data.update(keys)
  return c.data


def test_by_source_scores_each_answer_with_its_sources_verifier():
  fn = verifiers.from_config(
      data(reward='numeric_match', reward_by_source='openai/gsm8k=gsm8k_strict'), task=None)
  answers = [examples.Reference('7', data_source=s) for s in ('openai/gsm8k', 'other', '')]
  # '3 + 4 = 7' is right for the lenient verifier only; gsm8k rows use the strict one.
  np.testing.assert_array_equal(fn(['q'] * 3, ['3 + 4 = 7'] * 3, answers), [0, 1, 1])
  assert verifiers.take_metrics(fn) == {}
  fn.close()


def test_the_default_is_the_tasks_or_boxed_numeric_for_a_dataset():
  task = ml_collections.ConfigDict({'reward_fn': 'the task verifier'})
  assert verifiers.from_config(data(), task=task) == 'the task verifier'
  assert verifiers.from_config(data(), task=None).__name__ == '_boxed_numeric'


@pytest.mark.parametrize('keys,match', [
    (dict(reward='nope'), "config.data.reward='nope' is not valid"),
    (dict(reward_by_source='a=nope'), "config.data.reward='nope' is not valid"),
    (dict(reward_by_source='a'), "'a' is not SOURCE=REWARD"),
    (dict(reward_by_source='a=exact_match;a=format'), "names 'a' twice"),
    (dict(reward='tests.data.user_rewards:reward_len'), "reward_signature='verl'"),
    (dict(reward_signature='trl'), "reward_signature='trl'|"),
    (dict(reward_signature='openrlhf'), 'valid:'),
])
def test_a_bad_verifier_setting_is_named_before_any_compute(keys, match):
  if keys == dict(reward_signature='trl'):  # no function named: the signature is unused
    verifiers.check_config(data(**keys))
    return
  with pytest.raises(ValueError, match=match):
    verifiers.check_config(data(**keys))
