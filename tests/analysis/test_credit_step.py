"""Tests of jtc.analysis.credit_step: the measured update is the trainer's (`update.update_step`
on the same state and mini-batch gives the same parameters and optimiser state), under AdamW and
under plain SGD (both slow: they compile on the transformer); a bad preconditioning is refused
before any compute; the mini-batches are whole groups."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import objectives
from jtc.analysis import coupling
from jtc.analysis import credit_step
from jtc.models import model
from jtc.rl import update

G, P, T = 2, 2, 3


@pytest.fixture(scope='module')
def setup():
  cfg = model.ModelConfig.tiny(vocab_size=12, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                               head_dim=8, d_ff=32)
  params = model.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(
      np.concatenate(
          [np.tile([1, 2],
                   (2 * G, 1)), rng.integers(3, 9, size=(2 * G, T))], 1), jnp.int32)
  inm = jnp.ones_like(tokens)
  fn = jax.jit(coupling.policy_logps_fn(cfg, tokens, inm, completion_start=P))
  mb = update.Batch(tokens_BL=tokens, input_mask_BL=inm, mask_BT=jnp.ones(
      (2 * G, T)), advantages_B=jnp.array([1.0, -1.0, 0.7, -0.7]),
                    old_logps_BT=fn(params) + 0.01 * jnp.arange(2 * G * T).reshape(2 * G, T) / 12)
  return cfg, params, fn, mb


@pytest.mark.slow  # compiles the trainer's update: ~20 s of CPU each
@pytest.mark.parametrize('loss_name', ['grpo', 'dfpo_min_replace'])
def test_the_measured_update_is_the_trainers(setup, loss_name):
  cfg, params, fn, mb = setup
  optim = credit_step._optim(credit_step.Setting(learning_rate=1e-3))  # pylint: disable=protected-access
  optimizer = update.make_optimizer(optim, 10)
  opt_state = optimizer.init(params)
  lr = float(update.learning_rate_schedule(optim, 10)(0))
  got = credit_step.measure(fn, params, opt_state, mb, loss_name=loss_name, group_size=G,
                            optimizer=optimizer, optim=optim, learning_rate=lr, with_coupling=False)
  state = update.TrainState(step=jnp.int32(0), params=params, opt_state=opt_state)
  want, _ = update.update_step(state, jax.tree.map(lambda x: x[None], mb), model_config=cfg,
                               optimizer=optimizer, loss_name=loss_name,
                               loss_hparams=objectives.default_hparams(loss_name),
                               completion_start=P, group_size=G)
  for a, b in zip(jax.tree.leaves(got['after']), jax.tree.leaves(want.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
  assert set(got['flip']) >= {'boosted_pos', 'boosted_neg', 'flipped'}
  assert got['mass']['sign_balance'] > 0


@pytest.mark.slow  # compiles the re-scoring and the coefficients on the transformer: ~10 s
def test_sgd_steps_against_the_gradient(setup):
  _, params, fn, mb = setup
  got = credit_step.measure(fn, params, None, mb, loss_name='grpo', group_size=G, optimizer=None,
                            optim=None, learning_rate=0.1, preconditioning='sgd',
                            with_coupling=False)
  grads = jax.grad(lambda p: jnp.sum(fn(p) * got['coef']))(params)
  for a, p, g in zip(jax.tree.leaves(got['after']), jax.tree.leaves(params),
                     jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, p - 0.1 * g, rtol=1e-5, atol=1e-7)


def test_unknown_preconditioning_is_refused_before_any_compute():
  with pytest.raises(ValueError, match="preconditioning='newton'; valid: 'adam', 'sgd'"):
    credit_step.measure(None, None, None, None, loss_name='grpo', group_size=G, optimizer=None,
                        optim=None, learning_rate=0.1, preconditioning='newton')


def test_minibatches_are_whole_groups():
  setting = credit_step.Setting(prompts=4, group_size=3, minibatches=2)
  b = 12
  batch = update.Batch(tokens_BL=jnp.arange(b)[:, None], input_mask_BL=jnp.ones(
      (b, 1)), mask_BT=jnp.ones((b, 1)), advantages_B=jnp.arange(b, dtype=jnp.float32),
                       old_logps_BT=jnp.zeros((b, 1)))
  mbs = credit_step.minibatches(batch, setting, jax.random.key(0))
  rows = np.concatenate([np.asarray(m.tokens_BL[:, 0]) for m in mbs])
  assert sorted(rows.tolist()) == list(range(b))
  for m in mbs:
    groups = np.asarray(m.tokens_BL[:, 0]).reshape(-1, 3) // 3
    assert (groups == groups[:, :1]).all()
