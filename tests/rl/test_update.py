"""Tests of jtc.rl.update: exact gradient accumulation, mini-batches sliced on the device, the
learning-rate schedule and the optimiser settings."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import common
from jtc.models import model as model_lib
from jtc import objectives
from jtc.rl import update


def _batch(loss_name, G=2, M=4, P=3, T=5):
  B = G * M
  keys = jax.random.split(jax.random.key(1), 5)
  tokens = jax.random.randint(keys[0], (B, P + T), 3, 32)
  lengths = jax.random.randint(keys[1], (B,), 1, T + 1)  # unequal lengths matter for token_mean
  mask = (jnp.arange(T)[None] < lengths[:, None]).astype(jnp.float32)
  return update.Batch(
      tokens_BL=tokens,
      input_mask_BL=jnp.concatenate([jnp.ones(
          (B, P), jnp.int32), mask.astype(jnp.int32)],
                                    1), mask_BT=mask, advantages_B=jax.random.normal(keys[2], (B,)),
      old_logps_BT=-1.0 - jax.random.uniform(keys[3], (B, T)),
      token_weights_BT=(0.8 + 0.4 * jax.random.uniform(keys[4],
                                                       (B, T)) if loss_name == 'delta' else None))


@pytest.mark.parametrize('loss_name', ['grpo', 'dapo', 'delta', 'dfpo_min_replace'])
def test_gradient_accumulation_equals_one_minibatch(loss_name):
  """n micro-batches with `microbatch_weights` == the un-split mini-batch (loss, params)."""
  G, P = 2, 3
  mc = model_lib.ModelConfig.tiny(vocab_size=32, n_layers=1, d_ff=64)
  params = model_lib.init_params(mc, jax.random.key(0))
  batch = _batch(loss_name, G=G, P=P)
  opt = optax.sgd(1.0)
  step = functools.partial(update.update_step, model_config=mc, optimizer=opt, loss_name=loss_name,
                           loss_hparams=objectives.default_hparams(loss_name), completion_start=P,
                           group_size=G)

  def run(n):
    state = update.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=opt.init(params))
    return jax.jit(step)(state,
                         update.minibatch(batch, jnp.arange(batch.tokens_BL.shape[0]), num_micro=n))

  (s1, m1), (s4, m4) = run(1), run(4)
  np.testing.assert_allclose(m4['loss'], m1['loss'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m4['grad_norm'], m1['grad_norm'], rtol=1e-4, atol=1e-7)
  for a, b in zip(jax.tree.leaves(s4.params), jax.tree.leaves(s1.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert m1['grad_norm'] > 0


def test_accumulation_casts_the_weights_inside_each_micro_batch():
  """With n > 1 micro-batches the parameters pass an optimisation barrier tied to each
  micro-batch (so their compute-dtype casts are not hoisted out of the loop and held through
  the update): one barrier more than a single micro-batch's program (which has no loop)."""
  mc = model_lib.ModelConfig.tiny(vocab_size=32, n_layers=1, d_ff=64, dtype='bfloat16')
  params = jax.eval_shape(lambda: model_lib.init_params(mc, jax.random.key(0)))
  batch, opt = _batch('grpo'), optax.sgd(1.0)
  step = functools.partial(update.update_step, model_config=mc, optimizer=opt, loss_name='grpo',
                           loss_hparams=objectives.default_hparams('grpo'), completion_start=3,
                           group_size=2)
  state = update.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                            opt_state=jax.eval_shape(opt.init, params))
  text = lambda n: jax.jit(step).lower(
      state, update.minibatch(batch, jnp.arange(batch.tokens_BL.shape[0]), num_micro=n)).as_text()
  barriers = lambda n: text(n).count('stablehlo.optimization_barrier')
  assert barriers(4) == barriers(1) + 1


def test_microbatch_weights_closed_form():
  mask = jnp.array([[[1, 1, 0]], [[1, 0, 0]], [[1, 1, 1]]], jnp.float32)  # n=3, B=1, T=3
  np.testing.assert_allclose(update.microbatch_weights(mask, aggregation='token_mean'),
                             [2 / 6, 1 / 6, 3 / 6])
  np.testing.assert_allclose(update.microbatch_weights(mask, aggregation='seq_mean_token_mean'),
                             [1 / 3] * 3)


def test_minibatch_takes_whole_groups_in_the_given_order():
  G = 2
  batch = _batch('grpo', G=G)
  order_M = np.array([2, 0, 3, 1])
  rows = update.minibatch_rows(order_M, 0, 2, G)
  np.testing.assert_array_equal(rows, [4, 5, 0, 1])
  mb = update.minibatch(batch, jnp.asarray(rows), num_micro=2)
  assert mb.tokens_BL.shape == (2, 2) + batch.tokens_BL.shape[1:]
  np.testing.assert_array_equal(mb.tokens_BL.reshape(4, -1), batch.tokens_BL[rows])
  np.testing.assert_array_equal(mb.advantages_B.reshape(-1), batch.advantages_B[rows])
  assert mb.ref_logps_BT is None and mb.token_weights_BT is None


def test_schedule_warms_up_then_decays_to_the_floor():
  optim = common.get_config().optim
  total = 100
  lr = update.learning_rate_schedule(optim, total)
  warmup = int(round(optim.warmup_frac * total))
  assert float(lr(0)) == 0.0
  assert float(lr(warmup)) == pytest.approx(optim.learning_rate)
  assert float(lr(total)) == pytest.approx(optim.learning_rate * optim.min_lr_ratio)
  assert float(lr(10 * total)) == pytest.approx(optim.learning_rate * optim.min_lr_ratio)


@pytest.mark.parametrize('key,value', [('learning_rate', 0.0), ('grad_clip', -1.0),
                                       ('weight_decay', -0.1), ('adam_b2', 1.5), ('ppo_epochs', 0),
                                       ('warmup_frac', 1.0), ('minibatch_prompts', 3),
                                       ('microbatch_prompts', 3)])
def test_bad_optimiser_settings_name_the_key(key, value):
  optim = ml_collections.ConfigDict(common.get_config().optim.to_dict())
  optim[key] = value
  with pytest.raises(ValueError, match=f'optim.{key}'):
    update.check_config(optim, prompts_per_step=16)


def test_adam_direction_norm_is_the_update_before_the_learning_rate():
  """With a constant learning rate the update is -lr x (m_hat / (sqrt(v_hat) + eps) + wd theta),
  so `adam_direction_norm` equals ||update|| / lr at every step (bias corrections of counts 1-3
  included); the weight-decay term is part of it (dropping it is the failing control)."""
  optim = ml_collections.ConfigDict(
      dict(learning_rate=3e-3, warmup_frac=0.0, min_lr_ratio=1.0, weight_decay=0.1, grad_clip=0.0,
           adam_b1=0.9, adam_b2=0.99))
  opt = update.make_optimizer(optim, total_updates=10)
  params = {'w': jnp.array([[1.0, -2.0], [0.5, 3.0]]), 'b': jnp.array([0.2, -0.1])}
  state = opt.init(params)
  no_decay = ml_collections.ConfigDict(dict(optim.to_dict(), weight_decay=0.0))
  for k in range(3):
    grads = jax.tree.map(lambda p, k=k: jnp.sin(p * (k + 1)) * (k + 1), params)
    updates, state = opt.update(grads, state, params)
    got = update.adam_direction_norm(state, params, optim)
    np.testing.assert_allclose(got, optax.tree.norm(updates) / optim.learning_rate, rtol=1e-5)
    assert abs(update.adam_direction_norm(state, params, no_decay) - got) > 1e-3 * got
    params = optax.apply_updates(params, updates)
