"""Tests of jtc.objectives.registry: a loss added from a test module through the registry alone
validates, configures and trains a step; every spec's ranges accept its defaults and name a bad
value; docs/objectives.md's table is the registry's."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import common
from jtc import objectives
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.objectives import registry
from jtc.objectives import surrogates
from jtc.rl import config_check
from jtc.rl import update

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reinforce(inp, *, scale=1.0):
  """Plain policy gradient: obj = scale A exp(log r - sg(log r)), value scale A, gradient
  scale A grad log pi on every token (no clip)."""
  # A constant copy of log r: exp(log r - const) is 1 with gradient grad log pi.
  log_ratio_const_BT = jax.lax.stop_gradient(inp.log_ratio_BT)
  obj_BT = scale * inp.adv_B[:, None] * jnp.exp(inp.log_ratio_BT - log_ratio_const_BT)
  zeros_BT = jnp.zeros_like(obj_BT)
  w_B = surrogates.masked_mean_t(jnp.ones_like(obj_BT), inp.mask_BT)
  return registry.Surrogate(obj_BT=obj_BT, clip_low_BT=zeros_BT, clip_high_BT=zeros_BT, w_B=w_B,
                            w_grad_B=w_B)


@pytest.fixture
def registered():
  """'test_reinforce', registered for the test and removed after it."""
  registry.register('test_reinforce', aggregation='seq_mean_token_mean',
                    ranges={'scale': registry.POSITIVE}, about='plain policy gradient')(reinforce)
  yield 'test_reinforce'
  del registry.LOSSES['test_reinforce']


def test_a_registered_loss_validates_and_configures(registered):
  assert objectives.default_hparams(registered) == {
      'scale': 1.0,
      'aggregation': 'seq_mean_token_mean',
      'kl_coef': 0.0,
      'kl_estimator': 'k3',
      'entropy_coef': 0.0
  }
  with pytest.raises(ValueError, match=r'scale=-1.0 must be > 0'):
    objectives.check_hparams(registered, {'scale': -1.0})
  c = common.get_config('smoke')
  common.set_loss(c, registered, scale=2.0)
  config_check.validate(c)
  assert c.loss.hparams.scale == 2.0


def _on_policy_batch(params, mc, *, G=2, M=2, P=3, T=4):
  """A batch whose behaviour log-probs are the model's own (every ratio is 1)."""
  B = G * M
  keys = jax.random.split(jax.random.key(1), 3)
  tokens = jax.random.randint(keys[0], (B, P + T), 3, 32)
  lengths = jax.random.randint(keys[1], (B,), 1, T + 1)
  mask = (jnp.arange(T)[None] < lengths[:, None]).astype(jnp.float32)
  input_mask = jnp.concatenate([jnp.ones((B, P), jnp.int32), mask.astype(jnp.int32)], 1)
  logps = logprobs.sequence_logprobs(params, mc, tokens, input_mask, completion_start=P)['logps']
  return update.Batch(tokens_BL=tokens, input_mask_BL=input_mask, mask_BT=mask,
                      advantages_B=jax.random.normal(keys[2], (B,)), old_logps_BT=logps)


def test_a_registered_loss_trains_a_step_as_its_closed_form_says(registered):
  """On-policy every ratio is 1, inside GRPO's clip: plain policy gradient and GRPO take the
  same step, and ``scale`` multiplies the loss (SGD: the parameter change too)."""
  mc = model_lib.ModelConfig.tiny(vocab_size=32, n_layers=1, d_ff=64)
  params = model_lib.init_params(mc, jax.random.key(0))
  batch = jax.tree.map(lambda x: x[None], _on_policy_batch(params, mc))  # one micro-batch
  opt = optax.sgd(10.0)  # a large step: the parameter changes are far above float32 rounding

  def step_fn(name):
    fn = functools.partial(update.update_step, model_config=mc, optimizer=opt, loss_name=name,
                           loss_hparams=objectives.default_hparams(name), completion_start=3,
                           group_size=2)
    state = update.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=opt.init(params))
    jitted = jax.jit(fn)

    def step(**traced):  # hyper-parameters as traced values: one compile per loss
      new, metrics = jitted(state, batch, {f'loss.hparams.{k}': v for k, v in traced.items()})
      return jax.tree.map(lambda a, b: a - b, new.params, params), metrics

    return step

  step = step_fn(registered)
  moved, m = step(scale=jnp.float32(1.0))
  moved_x3, m_x3 = step(scale=jnp.float32(3.0))
  moved_grpo, m_grpo = step_fn('grpo')()
  assert m['grad_norm'] > 0
  np.testing.assert_allclose(m['loss'], m_grpo['loss'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m_x3['loss'], 3 * m['loss'], rtol=1e-5, atol=1e-7)
  for a, b, c in zip(*map(jax.tree.leaves, (moved, moved_grpo, moved_x3))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, 3 * a, rtol=1e-4, atol=1e-5)


def test_registration_refuses_a_taken_name_and_unnamed_hyper_parameters(registered):
  with pytest.raises(ValueError, match="'test_reinforce' is already registered"):
    registry.register(registered, aggregation='token_mean', ranges={'scale': registry.POSITIVE},
                      about='again')(reinforce)
  with pytest.raises(ValueError, match=r"ranges name \[\], .* are \['scale'\]"):
    registry.register('test_other', aggregation='token_mean', ranges={}, about='x')(reinforce)
  assert 'test_other' not in registry.LOSSES
  with pytest.raises(ValueError, match=r"unknown loss 'nope'; valid: \['cispo'"):
    registry.get('nope')


@pytest.mark.parametrize('name', sorted(registry.LOSSES))
def test_every_spec_accepts_its_defaults_and_names_a_bad_value(name):
  spec = registry.LOSSES[name]
  spec.validate(spec.defaults)
  for key, default in spec.defaults.items():
    bad = 'not-a-valid-value' if not isinstance(default, (int, float)) or key == 'eps' else -1.0
    if spec.ranges[key] is registry.ANY_NUMBER:
      continue  # global_scale: any number (or None)
    with pytest.raises(ValueError, match=key):
      spec.validate({**spec.defaults, key: bad})


def test_the_docs_table_is_the_registrys():
  with open(os.path.join(REPO, 'docs', 'objectives.md')) as f:
    doc = f.read()
  assert registry.markdown_table() in doc
