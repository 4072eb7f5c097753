"""The math_verify reward (jtc.data.math_verifier): agrees with boxed_numeric where both must,
the pool's timeout on its path, the missing-package error before any compute, the pool closed by
the trainer; and `data.reward=math_verify` trains (slow)."""
import dataclasses
import sys

import numpy as np
import pytest

from configs import grpo
from jtc.data import math_verifier
from jtc.data import rewards
from jtc.data import tasks
from jtc.data import verify_pool
from jtc.rl import config_check
from tests.data import test_verify_pool as pool_checks

# (completion, reference): answers both verifiers must call equal (known positives) ...
BOTH_CORRECT = [
    ('So the answer is \\boxed{42}.', '42'),
    ('\\boxed{-7}', '-7'),
    ('\\boxed{\\frac{1}{2}}', '0.5'),
    ('\\boxed{\\dfrac{3}{4}}', '3/4'),
    ('\\boxed{0.25}', '\\frac{1}{4}'),
    ('\\boxed{1,000}', '1000'),
    ('\\boxed{\\text{5}}', '5'),
    ('\\boxed{x = 6}', '6'),
    ('$\\boxed{12}$', '12'),
    ('\\boxed{\\$5}', '5'),
]
# ... and unequal (known negatives).
BOTH_WRONG = [
    ('So the answer is \\boxed{41}.', '42'),
    ('\\boxed{7}', '-7'),
    ('\\boxed{\\frac{1}{3}}', '0.5'),
    ('\\boxed{0.3}', '\\frac{1}{3}'),
    ('\\boxed{6}', 'x = 5'),
    ('\\boxed{100}', '1000'),
    ('\\boxed{}', '3'),
    ('no answer here', '3'),
]


@pytest.fixture(scope='module')
def reward():
  with math_verifier.MathVerifyReward(workers=2, timeout_s=60) as fn:
    yield fn


def test_agrees_with_boxed_numeric_on_known_positives_and_negatives(reward):
  pairs = BOTH_CORRECT + BOTH_WRONG
  completions, answers = [c for c, _ in pairs], [a for _, a in pairs]
  expected = [1.0] * len(BOTH_CORRECT) + [0.0] * len(BOTH_WRONG)
  np.testing.assert_array_equal(rewards.boxed_numeric([''] * len(pairs), completions, answers),
                                expected)
  scores = reward([''] * len(pairs), completions, answers)
  assert scores.dtype == np.float32 and scores.shape == (len(pairs),)
  np.testing.assert_array_equal(scores, expected)
  # The pool runs the same function as the process itself.
  np.testing.assert_array_equal([math_verifier.math_verify_score(c, a) for c, a in pairs], expected)


def test_a_hanging_check_on_the_reward_path_scores_zero():
  with math_verifier.MathVerifyReward(workers=1, timeout_s=1.0,
                                      check=pool_checks.hanging_check) as fn:
    scores = fn(['', '', ''], ['a', pool_checks.HANG, 'b'], ['a', pool_checks.HANG, 'b'])
    np.testing.assert_array_equal(scores, [1.0, 0.0, 1.0])
    assert fn.pool.timeouts == 1


def test_unequal_batch_lengths_are_refused(reward):
  with pytest.raises(ValueError, match='equal length'):
    reward(['', ''], ['\\boxed{1}'], ['1'])


def _config(**data):
  c = grpo.get_config('smoke')
  with c.unlocked():
    for k, v in data.items():
      c.data[k] = v
  return c


def test_a_missing_package_is_an_error_naming_the_extra_before_any_process(monkeypatch):
  monkeypatch.setitem(sys.modules, 'math_verify', None)  # `import math_verify` now fails

  def no_pool(*args, **kwargs):
    raise AssertionError('a pool was started')

  monkeypatch.setattr(verify_pool, 'VerifierPool', no_pool)
  match = r"math-verify package.*'math' extra, pip install -e '\.\[math\]'"
  with pytest.raises(ValueError, match=match):
    config_check.validate(_config(reward='math_verify'))
  with pytest.raises(ValueError, match=match):
    rewards.make_reward_fn('math_verify', workers=1, timeout_s=1)
  config_check.validate(_config(reward='boxed_numeric'))  # the other verifiers need nothing


@pytest.mark.parametrize('key,value', [('verify_workers', 0), ('verify_workers', -2),
                                       ('verify_timeout_s', 0.0), ('verify_timeout_s', -1)])
def test_bad_pool_settings_are_refused_naming_the_key(key, value):
  with pytest.raises(ValueError, match=f'config.data.{key}={value!r}'):
    config_check.validate(_config(reward='math_verify', **{key: value}))


def test_unknown_reward_lists_math_verify():
  with pytest.raises(ValueError, match=r"config.data.reward='math_verfy'.*'math_verify'"):
    config_check.validate(_config(reward='math_verfy'))


def test_plain_reward_fns_need_no_closing():
  fn = rewards.make_reward_fn('boxed_numeric', workers=1, timeout_s=1)
  assert fn is rewards.boxed_numeric
  rewards.close_reward_fn(fn)  # nothing to end
  assert 'math_verify' in rewards.reward_names() and 'math_verify' not in rewards.REWARD_FNS


class Recording:
  """A reward fn that records what it scored and forwards close()."""

  def __init__(self, inner):
    self.inner, self.calls = inner, []

  def __call__(self, prompts, completions, answers):
    scores = self.inner(prompts, completions, answers)
    self.calls.append((list(completions), list(answers), scores))
    return scores

  def close(self):
    self.inner.close()


@pytest.mark.slow  # about a minute on a 2-core machine
def test_data_reward_math_verify_trains_and_closes_its_pool(tmp_path):
  """The default arithmetic task with the shipped base policy: its completions ("The answer is
  81.", "23+58=81.", "23+50=73,73+8=81,so 81.") get the task's own reward from math_verify
  too, the run finishes, and its workers are gone after it."""
  from jtc.rl import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  c = _config(reward='math_verify', verify_workers=2)
  trainer = trainer_lib.Trainer(c, str(tmp_path))
  pids = trainer.gen.reward_fn.pool.pids
  assert len(pids) == 2 and all(pool_checks.alive(p) for p in pids)
  recording = Recording(trainer.gen.reward_fn)
  trainer.gen = dataclasses.replace(trainer.gen, reward_fn=recording)
  last, stopped = trainer.run()
  assert stopped is None and last[0]['step'] == c.num_steps
  assert not any(pool_checks.alive(p) for p in pids)
  task = tasks.get_task('arithmetic')
  scored = [(c_, a, s)
            for cs, answers, scores in recording.calls
            for c_, a, s in zip(cs, answers, scores)]
  well_formed = [(c_, a, s) for c_, a, s in scored if task.format_of(c_) is not None]
  assert len(well_formed) >= len(scored) // 2, scored
  own = task.reward_fn([''] * len(well_formed), [c_ for c_, _, _ in well_formed],
                       [a for _, a, _ in well_formed])
  np.testing.assert_array_equal([s for _, _, s in well_formed], own)
  assert 0 < own.sum() < len(own)  # both verdicts occur
