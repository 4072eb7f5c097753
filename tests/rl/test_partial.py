"""Tests of jtc.rl.partial: the pool of groups in flight (add, continue, take, checkpoint state
exactly), partial rollouts under an unchanged greedy policy equal whole rollouts, each token's
policy version; the decoding settings that cannot work (a scheduler, slots, partial rollouts with
what they cannot do) name their keys."""

import os
import sys

import jax
import numpy as np
import pytest
from tests import procs

from configs import common
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import metric_writer
from jtc.data import tasks as tasks_lib
from jtc.models import bundles
from jtc.models import sampler as sampler_lib
from jtc.rl import partial
from jtc.rl import rollout

G, T = 2, 12
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
  """One prompt per step, two groups in flight, K = 2 decode steps per round and 3 slots for the
  rows: rows stop, are re-prefilled and continued, some in the next step (the same parameters
  as two policy versions). Greedy, each trained group's completions and log-probs are those of
  one uninterrupted call of its prompt, and each token names the version that drew it."""
  gen, params, examples = generator
  sampling = dict(num_samples=G, max_new_tokens=T, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                  greedy=True)
  prompts, answers = [e['prompt'] for e in examples], [e['answer'] for e in examples]
  whole, = rollout.generate(gen, params, [prompts[:3]], [answers[:3]], jax.random.key(0), sampling)
  pools = [partial.Pool.empty(G, T, gen.tokenizer.pad_id)]
  batches = iter([dict(prompt=[p], answer=[a]) for p, a in zip(prompts, answers)])
  c = common.get_config()
  c.rollout.prompts_per_step, c.rollout.max_decode_steps = 1, 2
  kw = dict(sampling=sampling, pools=pools, c=c)
  versions = []
  for step in range(2):
    (got,), _ = partial.collect(gen, params, [lambda: next(batches)], jax.random.key(step),
                                version=step, **kw)
    assert pools[0].rounds >= 1 and len(pools[0].prompts) == 1  # the other group in flight
    i = prompts.index(got_prompt(got, gen, prompts))
    rows = slice(i * G, (i + 1) * G)
    np.testing.assert_array_equal(got.completion_BT, whole.completion_BT[rows])
    np.testing.assert_allclose(got.sampler_logps_BT, whole.sampler_logps_BT[rows], atol=1e-4)
    np.testing.assert_array_equal(got.rewards_B, whole.rewards_B[rows])
    mask = got.completion_mask_BT > 0
    assert (got.versions_BT[~mask] == partial.NO_VERSION).all()
    assert (np.diff(np.where(mask, got.versions_BT, 9), axis=1) >= 0).all()  # older tokens first
    versions += list(np.unique(got.versions_BT[mask]))
  assert set(versions) == {0, 1}  # a group continued in the next step


def got_prompt(rollout_, gen, prompts):
  """The prompt (of ``prompts``) whose encoding starts ``rollout_``'s first row."""
  P = gen.prompt_width
  for p in prompts:
    tokens, _ = gen.encode([p])
    if (tokens[0] == rollout_.tokens_BL[0, :P]).all():
      return p
  raise AssertionError('no prompt matches')


@pytest.mark.parametrize('key,value,needle', [
    ('scheduler', 'static', "max_decode_steps=4 .* needs config.rollout.scheduler='continuous'"),
    ('behaviour_logps', 'recompute', "behaviour_logps='sampler'"),
    ('correction', 'tis', "correction='tis'"),
    ('routing_replay', 'behaviour', "routing_replay='behaviour'"),
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


PARTIAL = ('--config.rollout.scheduler=continuous', '--config.rollout.decode_slots=4',
           '--config.rollout.behaviour_logps=sampler', '--config.rollout.max_decode_steps=4',
           '--config.log.ledger_every=1', '--config.num_steps=3')


@pytest.mark.slow
def test_partial_rollouts_sigkill_then_resume_equals_uninterrupted(tmp_path):
  """The smoke run with partial rollouts and the ledger on, killed after its step-1 checkpoint
  (groups in flight) and resumed, logs what the uninterrupted run logs: the rows in flight
  come back from the checkpoint exactly. The ledger names each token's policy version: tokens
  of the current version match the sampler's log-probs to float rounding, older ones do not."""
  cmd = lambda w: [
      sys.executable, '-m', 'jtc.train', '--config=configs/grpo.py:smoke', f'--workdir={w}',
      *PARTIAL
  ]
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  proc = procs.run(cmd(whole), whole + '.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0, proc
  ended = procs.kill_after_checkpoint(cmd(killed), killed, 1, cwd=REPO, env=env)
  assert ended.returncode == -9, ended
  proc = procs.run(cmd(killed), killed + '.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0 and 'resumed from step' in proc.stderr, proc
  read = lambda w: [{
      k: v for k, v in r.items() if not k.startswith(('time_', 'tokens_per_s'))
  } for r in metric_writer.read_jsonl(os.path.join(w, 'metrics.jsonl'))]
  a, b = read(killed), read(whole)
  assert [r['step'] for r in a] == [r['step'] for r in b] == [0, 1, 2, 3]
  for ra, rb in zip(a, b):
    assert ra.keys() == rb.keys()
    for k in ra:
      np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert b[1]['partial/groups_in_flight'] > 0 and b[3]['partial/tokens_lag_1'] > 0
  step = ledger_lib.load(whole, 3)
  version, mask = step['policy_version_BT'], step['completion_mask_BT'] > 0
  mismatch = np.abs(step['mismatch_BT'])
  assert mismatch[mask & (version == 2)].max() < 1e-4 < mismatch[mask & (version == 1)].mean()
  # The step's mismatch by lag (`mismatch_lag`) says the same.
  assert b[3]['mismatch/lag0/max_abs'] < 1e-4 < b[3]['mismatch/lag1/mean_abs']
