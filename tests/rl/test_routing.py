"""Tests of jtc.rl.routing: the MoE keys refused with a named key on a policy that cannot take
them, the replayed experts of each mode, the step's flip metrics, and routing replay through the
step (rollout -> batch -> behaviour pass -> update) with its invariants."""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import common
from jtc import objectives
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig
from jtc.rl import batch as batch_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import routing
from jtc.rl import update as update_lib

MOE = ModelConfig.tiny_moe(n_experts=8)
DENSE = ModelConfig.tiny()


def _config(**updates):
  c = common.get_config()
  for key, value in updates.items():
    section, name = key.split('.')
    c[section][name] = value
  return c


@pytest.mark.parametrize('updates, model, size, pattern', [
    ({
        'rollout.routing_replay': 'some'
    }, MOE, 1, r"routing_replay='some' is not valid; valid: \['all', 'behaviour', 'none'\]"),
    ({
        'rollout.routing_replay': 'behaviour'
    }, DENSE, 1, r'routing_replay=.*dense.*\'none\''),
    ({
        'loss.router_aux_coef': 0.01
    }, DENSE, 1, 'router_aux_coef=0.01 needs a mixture'),
    ({
        'mesh.expert': 2
    }, DENSE, 1, r'mesh.expert=2 needs a mixture'),
    ({
        'mesh.expert': 3
    }, MOE, 1, r'mesh.expert=3 must divide .* n_experts=8 \(valid: \[1, 2, 4, 8'),
    ({}, ModelConfig.tiny_moe(moe_impl='ragged'), 4, "moe_impl='ragged'.*'blocks' or 'dense'"),
    ({
        'policy.moe_dispatch': 'all_to_all'
    }, DENSE, 1, r"policy.moe_dispatch='all_to_all' needs a mixture"),
    ({}, ModelConfig.tiny_moe(moe_dispatch='all_to_all'), 4, "moe_dispatch to 'replicated'"),
    ({
        'lora.rank': 4
    }, MOE, 1, "lora.targets=.*valid targets: 'q', 'k', 'v', 'o'"),
])
def test_bad_moe_settings_name_the_key(updates, model, size, pattern):
  with pytest.raises(ValueError, match=pattern):
    routing.check_config(_config(**updates), model, population_size=size)


def test_good_settings_pass():
  routing.check_config(_config(**{'rollout.routing_replay': 'all', 'mesh.expert': 4}), MOE)
  routing.check_config(_config(**{'lora.rank': 4, 'lora.targets': 'q,v'}), MOE)
  routing.check_config(_config(), DENSE)


def test_replayed_experts_of_each_mode():
  experts = np.arange(2 * 5 * 1 * 2).reshape(2, 5, 1, 2)
  assert routing.replay_experts(experts, 'none', 3) is None
  np.testing.assert_array_equal(routing.replay_experts(experts, 'all', 3), experts)
  got = routing.replay_experts(experts, 'behaviour', 3)
  assert (got[:, :3] == -1).all() and (got[:, 3:] == experts[:, 3:]).all()
  assert experts.min() == 0  # the sampler's array is left as it was


def test_step_metrics_flag_flipped_real_tokens():
  sampler = jnp.array([[[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[4, 5], [6, 7]]]])  # [1, 3, 2, 2]
  trainer = jnp.array([[[[1, 0], [2, 3]], [[0, 1], [2, 4]], [[4, 0], [6, 7]]]])
  mask = jnp.array([[1, 1, 0]])
  m = routing.step_metrics(sampler, trainer, jnp.array([[0.1, 1.0, 5.0]]), mask)
  np.testing.assert_array_equal(routing.token_flips(sampler, trainer, mask), [[False, True, False]])
  np.testing.assert_allclose([m['routing_flip_rate'], m['routing_flip_rate_layer1']], [0.5, 0.5])
  np.testing.assert_allclose(m['routing_flip_rate_layer0'], 0.0)
  np.testing.assert_allclose(m['routing_abs_delta_share'], 1.0 / 1.1, rtol=1e-6)


# ----------------------------------------------------------------------------------------
# Routing replay through the step: rollout -> batch -> behaviour pass -> update.

P, T = 4, 6
POLICY = ModelConfig.tiny_moe(vocab_size=23, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                              head_dim=8, n_experts=4, d_expert=16, moe_impl='dense')


def _routed_rollout(params, behaviour_fn):
  """Rollouts whose "sampler" has the trainer's numerics bit for bit (the same compiled behaviour
  pass) but routed three tokens elsewhere: completion tokens (row 1, t = 2, layer 0) and (row 2,
  t = 4, layer 1), and prompt token (row 0, position 2, layer 0: the last layer's output of a
  prompt token would reach no later position). Its log-probs are that pass's
  with those experts replayed."""
  rng = np.random.default_rng(0)
  B = 4
  tokens = rng.integers(2, 23, (B, P + T)).astype(np.int32)
  mask = np.ones((B, P + T), np.int32)
  mask[3, :2] = 0  # a left-padded prompt
  mask[2, P + 5:] = 0  # a completion that ended
  own = np.asarray(
      model_lib.forward(params, POLICY, tokens, model_lib.positions_from_mask(mask),
                        mask).routed.experts_BLW).transpose(1, 2, 0, 3)  # [B, L, Y, W]
  experts = own.astype(np.int16)
  for b, l, y in ((1, P + 2, 0), (2, P + 4, 1), (0, 2, 0)):
    experts[b, l, y] = [e for e in range(4) if e not in own[b, l, y]]  # the other two
  sampler_logps = np.asarray(behaviour_fn(params, tokens, mask, experts)['logps'])
  return rollout_lib.Rollout(tokens_BL=tokens, input_mask_BL=mask, completion_BT=tokens[:, P:],
                             completion_mask_BT=mask[:, P:], sampler_logps_BT=sampler_logps,
                             truncated_B=np.zeros(B, bool), rewards_B=np.array([1, 0, 0, 1],
                                                                               np.float32),
                             texts=('x',) * B, experts_BLYW=experts)


@pytest.fixture(scope='module')
def replayed():
  """(params, the rollout, {mode: (batch, metrics)} of `batch.make_batch` on `_routed_rollout`,
  the jitted behaviour pass)."""
  params = model_lib.init_params(POLICY, jax.random.key(3))
  behaviour_fn = rollout_lib.jit_behaviour(POLICY, completion_start=P, return_hidden=False)
  ro = _routed_rollout(params, behaviour_fn)
  out = {}
  for mode in routing.REPLAYS:
    c = _config(**{'rollout.routing_replay': mode})
    c.rollout.sampling.num_samples, c.data.prompt_width = 2, P
    batch, (metrics,), _ = batch_lib.make_batch(c, [ro], params, update_lib.RunState.init(23),
                                                task=None, behaviour_fn=behaviour_fn,
                                                ref_params=None, to_device=jnp.asarray)
    out[mode] = batch, metrics
  return params, ro, out, behaviour_fn


def test_replay_makes_the_behaviour_pass_the_samplers_exactly(replayed):
  """'all': the behaviour log-probs equal the sampler's bit for bit; 'behaviour' too except
  row 0, whose flipped prompt token it leaves to the router: equal before that token's position,
  different from it on; 'none': different exactly from each row's first flip on."""
  _, ro, out, _ = replayed
  sampler, real = ro.sampler_logps_BT, ro.completion_mask_BT > 0
  first = {0: 2, 1: P + 2, 2: P + 4}  # each row's first flipped position (prompt included)
  predicted_at = P - 1 + np.arange(T)  # completion token t is predicted at position P + t - 1
  for mode, flipped_rows in (('all', ()), ('behaviour', (0,)), ('none', (0, 1, 2))):
    got = np.asarray(out[mode][0].old_logps_BT)
    for b in range(4):
      same = got[b] == sampler[b]
      if b in flipped_rows:
        before = predicted_at < first[b]
        assert same[before & real[b]].all() and not same[~before & real[b]].any(), (mode, b)
      else:
        assert same[real[b]].all(), (mode, b)
  assert out['none'][0].replay_BLYW is None
  np.testing.assert_array_equal(out['all'][0].replay_BLYW, ro.experts_BLYW)
  assert (np.asarray(out['behaviour'][0].replay_BLYW)[:, :P] == -1).all()


def test_the_behaviour_pass_returns_no_scalar_its_chunks_could_not_concatenate(replayed):
  """`rollout.behaviour_logps` concatenates chunks of rows: the behaviour pass returns per-row
  arrays only (the router's experts, not the load-balancing loss, which the update computes)."""
  params, ro, _, behaviour_fn = replayed
  out = behaviour_fn(params, ro.tokens_BL, ro.input_mask_BL, ro.experts_BLYW)
  assert set(out) == {'logps', 'entropy', 'experts'}
  assert out['experts'].shape == (4, T, 2, 2)


def test_the_flip_metrics_count_the_flipped_completion_tokens(replayed):
  """Two real completion tokens of 23 flip (the prompt's flip is not a completion token's), one
  in each layer; whatever the replay, the flips are the router's own choice against the sampler's."""
  _, ro, out, _ = replayed
  n = ro.completion_mask_BT.sum()
  for mode in routing.REPLAYS:
    m = out[mode][1]
    assert m['mismatch/routing_flip_rate'] == pytest.approx(2 / n)
    assert m['mismatch/routing_flip_rate_layer0'] == pytest.approx(1 / n)
    assert m['mismatch/routing_flip_rate_layer1'] == pytest.approx(1 / n)
  assert out['all'][1]['mismatch/mean_abs'] == 0.0  # replayed: the sampler's numbers exactly


@pytest.mark.slow
def test_the_update_replays_the_batch_and_adds_the_load_balancing_loss(replayed):
  """One update on the 'all' batch: with its replay the ratios start at 1 (the behaviour pass
  replayed the same experts); without it the flipped rows' ratios move. The load-balancing loss
  is logged and, with a coefficient, changes the router's update."""
  params, _, out, _ = replayed
  batch = out['all'][0]
  optimizer = optax.sgd(1.0)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=optimizer.init(params))
  mb = jax.tree.map(lambda x: x[None], batch)  # one micro-batch

  fn = functools.partial(update_lib.update_step, model_config=POLICY, optimizer=optimizer,
                         loss_name='grpo', loss_hparams=objectives.default_hparams('grpo'),
                         completion_start=P, group_size=2)
  # The coefficient traced: one compilation per batch structure (with / without the replay).
  update = jax.jit(lambda state, mb, coef: fn(state, mb, router_aux_coef=coef))
  step = lambda mb, coef: update(state, mb, jnp.float32(coef))

  replay_state, replay_m = step(mb, 0.0)
  _, plain_m = step(mb.replace(replay_BLYW=None), 0.0)
  assert float(replay_m['approx_kl']) < 1e-9 < float(plain_m['approx_kl'])
  assert float(replay_m['router_aux']) > 0
  aux_state, _ = step(mb, 10.0)
  router = lambda s: s.params['layers']['mlp']['router']['kernel']
  assert float(jnp.max(jnp.abs(router(aux_state) - router(replay_state)))) > 1e-6


@pytest.mark.slow  # three trainer processes, ~3 min on a loaded 2-core CPU
def test_a_moe_run_with_replay_and_the_ledger_resumes_exactly(tmp_path):
  """A random tiny MoE policy trained with routing replay, the load-balancing loss and the ledger
  on: the routing metrics are logged, the ledger holds the routing-flip column, and a run killed
  after its step-1 checkpoint and resumed logs what the uninterrupted run logs."""
  from jtc.analysis import ledger as ledger_lib  # pylint: disable=import-outside-toplevel
  from jtc.analysis import metric_writer  # pylint: disable=import-outside-toplevel
  from jtc.models import bundles  # pylint: disable=import-outside-toplevel
  from jtc.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from tests import procs  # pylint: disable=import-outside-toplevel
  spec = {'kind': 'char'}
  config = ModelConfig.tiny_moe(vocab_size=tokenizer_lib.from_spec(spec).vocab_size, n_layers=2,
                                d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, n_experts=4,
                                d_expert=32)
  policy = str(tmp_path / 'policy')
  bundles.save_policy_bundle(policy, model_config=config,
                             params=model_lib.init_params(config,
                                                          jax.random.key(0)), tokenizer_spec=spec)
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = lambda workdir: [
      sys.executable, '-m', 'jtc.train', '--config=configs/dfpo_min_replace.py:smoke',
      f'--workdir={workdir}', f'--config.policy.init={policy}', '--config.num_steps=3',
      '--config.rollout.routing_replay=behaviour', '--config.loss.router_aux_coef=0.01',
      '--config.log.ledger_every=1', '--config.eval.every=3'
  ]
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  proc = procs.run(cmd(whole), f'{whole}.stderr.log', cwd=repo, env=env)
  assert proc.returncode == 0, proc
  assert procs.kill_after_checkpoint(cmd(killed), killed, 1, cwd=repo, env=env).returncode == -9
  proc = procs.run(cmd(killed), f'{killed}.stderr.log', cwd=repo, env=env)
  assert proc.returncode == 0 and 'resumed from step' in proc.stderr, proc
  read = lambda w: [{
      k: v for k, v in r.items() if not k.startswith(('time_', 'tokens_per_s'))
  } for r in metric_writer.read_jsonl(os.path.join(w, 'metrics.jsonl'))]
  a, b = read(whole), read(killed)
  assert [r['step'] for r in a] == [r['step'] for r in b] == [0, 1, 2, 3]
  for ra, rb in zip(a, b):
    assert ra.keys() == rb.keys()
    for k in ra:
      np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert {'mismatch/routing_flip_rate', 'mismatch/routing_flip_rate_layer1',
          'router_aux'} <= a[1].keys()
  ledger = ledger_lib.load(whole, 2)
  assert ledger['routing_flip_BT'].shape == ledger['completion_mask_BT'].shape
