"""Tests of jtc.rl.partial: the pool of groups in flight (add, continue, take, checkpoint state
exactly), partial rollouts under an unchanged greedy policy equal whole rollouts, each token's
policy version; the decoding settings that cannot work (a scheduler, slots, partial rollouts with
what they cannot do) name their keys."""

import jax
import numpy as np
import pytest

from configs import common
from jtc.data import tasks as tasks_lib
from jtc.models import bundles
from jtc.models import sampler as sampler_lib
from jtc.rl import partial
from jtc.rl import rollout

G, T = 2, 12


def test_pool_continues_rows_takes_the_earliest_complete_groups_and_restores_exactly():
  pool = partial.Pool.empty(G, T, pad_id=0)
  pool.add(['a', 'b', 'c'], ['1', '2', '3'], pad_id=0)
  out = lambda toks, fin, eos: sampler_lib.SampleOutput(
      tokens_RL=None, input_mask_RL=None, completion_RT=np.array(toks + [0] * (T - len(toks)))[
          None], completion_mask_RT=np.array([1] * len(toks) + [0] * (T - len(toks)))[None],
      logps_RT=-np.arange(1, T + 1, dtype=np.float32)[None] / 10, truncated_R=np.array(
          [fin and not eos]), finished_R=np.array([fin]))
  pool.write([2], [0], out([5, 6], False, False), version=3)  # group c row 0: 2 tokens, unfinished
  pool.write([2], [0], out([7], True, True), version=4)  # then 1 more at version 4: EOS
  pool.write([2], [1], out([8] * T, True, False), version=4)  # row 1: T tokens, truncated
  for g in range(G):
    pool.write([0], [g], out([9], True, True), version=4)
  np.testing.assert_array_equal(pool.tokens_NGT[2, 0, :4], [5, 6, 7, 0])
  np.testing.assert_array_equal(pool.versions_NGT[2, 0, :4], [3, 3, 4, partial.NO_VERSION])
  np.testing.assert_allclose(pool.logps_NGT[2, 0, :3], [-0.1, -0.2, -0.1])
  np.testing.assert_array_equal(pool.complete_N, [True, False, True])
  restored = partial.Pool.from_state(pool.state())
  for k in partial.Pool.ARRAYS:
    np.testing.assert_array_equal(getattr(restored, k), getattr(pool, k))
    assert getattr(restored, k).dtype == getattr(pool, k).dtype
  taken = pool.take(1)  # a entered before c
  assert taken['prompts'] == ['a'] and pool.prompts == ['b', 'c']
  assert taken['eos_NG'].all() and list(pool.eos_NG[1]) == [True, False]
  with pytest.raises(ValueError, match='complete groups'):
    pool.take(2)


@pytest.fixture(scope='module')
def generator():
  bundle = bundles.load_policy_bundle('base')
  task = tasks_lib.get_task('arithmetic')
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=20, scheduler='continuous',
                          slots=3)
  examples = task.examples('test', seed=0, num_examples=4)
  return gen, bundle.params, examples


@pytest.mark.slow
def test_partial_rollouts_of_an_unchanged_greedy_policy_are_its_whole_rollouts(generator):
  """K = 2 decode steps per round and 3 slots for 4 rows: rows stop, are re-prefilled and
  continued (the same parameters as two policy versions); greedy, each completion and its
  log-probs are those of one uninterrupted call, and each token names the round's version."""
  gen, params, examples = generator
  sampling = dict(num_samples=G, max_new_tokens=T, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                  greedy=True)
  prompts, answers = [e['prompt'] for e in examples], [e['answer'] for e in examples]
  whole, = rollout.generate(gen, params, [prompts[:2]], [answers[:2]], jax.random.key(0), sampling)
  pools = [partial.Pool.empty(G, T, gen.tokenizer.pad_id)]
  batches = iter([dict(prompt=prompts[:2], answer=answers[:2])])
  kw = dict(sampling=sampling, max_decode_steps=2, prompts_per_step=1)
  (first,), rounds = partial.collect(gen, params, pools, [lambda: next(batches)], jax.random.key(1),
                                     version=0, **kw)
  assert rounds >= 2 and len(pools[0].prompts) == 1  # one group left in flight
  np.testing.assert_array_equal(first.completion_BT, whole.completion_BT[:G])
  np.testing.assert_allclose(first.sampler_logps_BT, whole.sampler_logps_BT[:G], atol=1e-4)
  # The second group finishes in the next step, at version 1, under the "newer" policy.
  batches = iter([dict(prompt=prompts[2:3], answer=answers[2:3])])
  (second,), _ = partial.collect(gen, params, pools, [lambda: next(batches)], jax.random.key(2),
                                 version=1, **kw)
  np.testing.assert_array_equal(second.completion_BT, whole.completion_BT[G:])
  np.testing.assert_array_equal(second.rewards_B, whole.rewards_B[G:])
  versions, mask = second.versions_BT, second.completion_mask_BT > 0
  assert set(np.unique(versions[mask])) == {0, 1} and (versions[~mask] == partial.NO_VERSION).all()
  assert (np.diff(np.where(mask, versions, 9), axis=1) >= 0).all()  # older tokens first


@pytest.mark.parametrize('key,value,needle', [
    ('scheduler', 'static', "max_decode_steps=4 .* needs config.rollout.scheduler='continuous'"),
    ('behaviour_logps', 'recompute', "behaviour_logps='sampler'"),
    ('correction', 'tis', "correction='tis'"),
])
def test_partial_rollouts_refuse_what_they_cannot_do_naming_the_keys(key, value, needle):
  c = common.get_config()
  c.rollout.scheduler, c.rollout.behaviour_logps, c.rollout.max_decode_steps = ('continuous',
                                                                                'sampler', 4)
  partial.check_config(c)
  c.rollout[key] = value
  with pytest.raises(ValueError, match=needle):
    partial.check_config(c)


@pytest.mark.parametrize('scheduler,slots,needle', [
    ('dynamic', None, 'config.rollout.scheduler'),
    ('continuous', 0, r'config.rollout.decode_slots=0 must be an int in \[1, 128\]'),
    ('continuous', 129, 'config.rollout.decode_slots=129'),
    ('static', 8, "decode_slots=8 needs config.rollout.scheduler='continuous'"),
])
def test_bad_scheduler_settings_name_the_keys(scheduler, slots, needle):
  c = common.get_config()  # 16 prompts x 8 samples: 128 rows per sampler call
  c.rollout.scheduler, c.rollout.decode_slots = scheduler, slots
  with pytest.raises(ValueError, match=needle):
    partial.check_config(c)
  c.rollout.scheduler, c.rollout.decode_slots = 'continuous', 128
  partial.check_config(c)
