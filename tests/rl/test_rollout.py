"""Tests of jtc.rl.rollout: DAPO shaping and refill, generate (and evaluate agreeing with it)."""

import jax
import numpy as np
import pytest

from jtc.models import bundles
from jtc.rl import evaluation
from jtc.rl import rollout
from jtc.data import tasks as tasks_lib


def _rollout(rewards, tag, T=3):
  B = len(rewards)
  return rollout.Rollout(tokens_BL=np.full((B, T + 1), tag), input_mask_BL=np.ones(
      (B, T + 1), np.int32), completion_BT=np.arange(B * T).reshape(B, T) + 100 * tag,
                         completion_mask_BT=np.ones((B, T), np.int32), sampler_logps_BT=np.zeros(
                             (B, T), np.float32), truncated_B=np.zeros(B, bool),
                         rewards_B=np.asarray(rewards, np.float32),
                         texts=tuple(f'{tag}-{i}' for i in range(B)),
                         prompts=tuple(f'p{tag}-{i // 2}' for i in range(B)),
                         answers=tuple(f'a{tag}-{i // 2}' for i in range(B)))


def test_overlong_shaping_matches_dapo_formula():
  lengths = np.array([0, 10, 32, 33, 36, 40])
  got = rollout.overlong_shaping(lengths, max_new_tokens=40, buffer=8, penalty=1.0)
  # DAPO: 0 if L <= Lmax - Lcache; (Lmax - Lcache - L) / Lcache inside the buffer; -1 at Lmax.
  want = [0.0 if L <= 32 else (32 - L) / 8 for L in lengths]
  np.testing.assert_allclose(got, want)


def test_informative_groups_are_those_with_unequal_rewards():
  keep = rollout.informative_groups(np.array([1, 1, 0, 1, 0, 0], np.float32), 2)
  np.testing.assert_array_equal(keep, [False, True, False])


def test_dynamic_sampling_refill_replaces_only_zero_variance_groups():
  G = 2
  ro = _rollout([1, 1, 0, 1, 0, 0], tag=1)  # groups: flat, informative, flat
  donor = _rollout([0, 0, 1, 0, 0, 1], tag=2)  # groups: flat, informative, informative
  new = rollout.refill(ro, donor, rollout.informative_groups(ro.rewards_B, G), G)
  # Group 1 (informative) untouched; groups 0 and 2 get the donor's groups 1 and 2.
  np.testing.assert_array_equal(new.rewards_B, [1, 0, 0, 1, 0, 1])
  assert new.texts == ('2-2', '2-3', '1-2', '1-3', '2-4', '2-5')
  assert new.prompts == ('p2-1', 'p2-1', 'p1-1', 'p1-1', 'p2-2', 'p2-2')  # each row's own prompt
  assert new.answers == ('a2-1', 'a2-1', 'a1-1', 'a1-1', 'a2-2', 'a2-2')
  np.testing.assert_array_equal(new.completion_BT[0], donor.completion_BT[2])
  np.testing.assert_array_equal(new.completion_BT[2], ro.completion_BT[2])
  np.testing.assert_array_equal(new.tokens_BL[:2], donor.tokens_BL[2:4])
  assert rollout.informative_groups(new.rewards_B, G).all()


def test_correct_is_reward_above_one_half():
  np.testing.assert_array_equal(rollout.is_correct([0.0, 0.5, 0.51, 1.0]),
                                [False, False, True, True])
  assert _rollout([1, 0, 0.5], tag=1).correct_B.tolist() == [True, False, False]


def _sampling(k, **kw):
  return dict(
      dict(num_samples=k, max_new_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), **kw)


def test_generate_scores_every_sample_and_evaluate_agrees_with_it():
  """The one sample -> decode -> score path: rewards are the verifier's on the decoded texts,
  and evaluate()'s avg@k over one batch equals the mean correctness of the same samples."""
  bundle = bundles.load_policy_bundle('base')
  task = tasks_lib.get_task('arithmetic')
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=20)
  prompts, answers = ['What is 23+58?', 'What is 12+9?'], ['81', '21']
  ro, = rollout.generate(gen, bundle.params, [prompts], [answers], jax.random.key(0), _sampling(4))
  assert ro.rewards_B.shape == (8,) and len(ro.texts) == 8
  want = task.reward_fn([p for p in prompts for _ in range(4)], list(ro.texts),
                        [a for a in answers for _ in range(4)])
  np.testing.assert_array_equal(ro.rewards_B, want)
  examples = [dict(prompt=p, answer=a) for p, a in zip(prompts, answers)]
  out, = evaluation.evaluate(gen, bundle.params, examples, jax.random.key(0), sampling=_sampling(4),
                             batch_prompts=2, task=task)
  # Batch s = 0 uses fold_in(rng, 0) as its key: the same draw as generate with that key.
  ro0, = rollout.generate(gen, bundle.params, [prompts], [answers],
                          jax.random.fold_in(jax.random.key(0), 0), _sampling(4))
  assert out['avg@4'] == pytest.approx(ro0.correct_B.mean())


def test_chunked_generation_scores_the_same_prompts():
  bundle = bundles.load_policy_bundle('base')
  task = tasks_lib.get_task('arithmetic')
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=20, chunk_prompts=1)
  prompts, answers = ['What is 23+58?', 'What is 12+9?'], ['81', '21']
  ro, = rollout.generate(gen, bundle.params, [prompts], [answers], jax.random.key(1), _sampling(2))
  assert ro.tokens_BL.shape[0] == 4
  want = task.reward_fn([p for p in prompts for _ in range(2)], list(ro.texts),
                        [a for a in answers for _ in range(2)])
  np.testing.assert_array_equal(ro.rewards_B, want)


@pytest.mark.parametrize('key,value', [('num_samples', 0), ('top_p', 0.0), ('top_k', -1),
                                       ('min_p', 2.0), ('temperature', 0.0)])
def test_bad_sampling_settings_name_the_key(key, value):
  import ml_collections  # pylint: disable=import-outside-toplevel
  section = ml_collections.ConfigDict(_sampling(4, **{key: value}))
  with pytest.raises(ValueError, match=f'config.rollout.sampling.{key}'):
    rollout.check_sampling(section, 'config.rollout.sampling')
