"""Tests of jtc.models.params: a hybrid's stacks hold its layers of each kind, norms start at the
identity in both weight conventions, every parameter has logical axes, and the per-layer layout
is refused for a model with several layer kinds."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import axes
from jtc.models import layers
from jtc.models import params as params_lib
from jtc.models.model_config import ModelConfig

DENSE = ModelConfig.tiny(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24)


@pytest.fixture(scope='module')
def dense():
  return params_lib.init_params(DENSE, jax.random.key(3))


@pytest.fixture(scope='module')
def hybrid():
  config = ModelConfig.tiny_hybrid(n_layers=8, d_model=32, head_dim=8, d_ff=48)
  return config, params_lib.init_params(config, jax.random.key(0))


def test_stacks_hold_the_layers_of_their_kind(hybrid):
  config, params = hybrid
  shapes = jax.tree.map(lambda x: x.shape, params['layers'])
  assert shapes['attn']['q']['kernel'] == (2, 32, 4, 8)
  assert shapes['attn']['q_gate']['kernel'] == (2, 32, 4, 8)
  assert shapes['linear_attn']['v']['kernel'] == (6, 32, 4, 32)
  assert shapes['linear_attn']['conv_q']['kernel'] == (6, 4, 2, 32)
  assert shapes['mlp']['up']['kernel'] == (8, 32, 48)
  assert shapes['attn_norm']['scale'] == (8, 32)
  a = np.exp(np.asarray(params['layers']['linear_attn']['a_log']))
  assert np.all((0.01 <= a) & (a <= 16))


def test_norms_start_at_the_identity_in_both_conventions(hybrid, dense):
  config, params = hybrid
  x = jax.random.normal(jax.random.key(1), (2, 3, 32))
  zero_centred = params['layers']['attn_norm']
  assert np.all(np.asarray(zero_centred['scale']) == 0)
  plain = dense['layers']['attn_norm']
  assert np.all(np.asarray(plain['scale']) == 1)
  a = layers.norm(x, {'scale': zero_centred['scale'][0]}, config)
  b = layers.rms_norm(x, jnp.ones(32), config.norm_eps, jnp.float32)
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_every_parameter_has_logical_axes(hybrid):
  _, params = hybrid
  names = axes.param_logical_axes(params)
  assert names['layers']['linear_attn']['q']['kernel'] == ('layers', 'embed', 'kv_heads',
                                                           'head_dim')
  assert names['layers']['linear_attn']['v']['kernel'] == ('layers', 'embed', 'heads', 'head_dim')
  assert names['layers']['linear_attn']['a_log'] == ('layers', 'heads')
  assert names['layers']['attn']['q_gate']['kernel'] == ('layers', 'embed', 'heads', 'head_dim')
  bad = {'layers': {'linear_attn': {'mystery': jnp.zeros((2, 3))}}}
  with pytest.raises(ValueError, match='no logical axes.*mystery.*below linear_attn'):
    axes.param_logical_axes(bad)


def test_the_per_layer_layout_is_refused_for_several_layer_kinds(hybrid):
  _, params = hybrid
  with pytest.raises(ValueError, match='different row counts'):
    params_lib.unstack_layers(params)


def test_a_dense_model_keeps_its_values(dense):
  """A dense layer draws its attention and MLP from the 7-way split of its key, as before the
  per-layer types (the shipped bundles and SFT runs reproduce; up to the rounding of the scale
  product, a different draw would differ everywhere)."""
  _, k_layers, _ = jax.random.split(jax.random.key(3), 3)
  kq, *_, kd = jax.random.split(jax.random.split(k_layers, 2)[1], 7)
  np.testing.assert_allclose(dense['layers']['attn']['q']['kernel'][1],
                             jax.random.normal(kq, (16, 2, 8)) / 4.0, rtol=1e-6)
  np.testing.assert_allclose(dense['layers']['mlp']['down']['kernel'][1],
                             jax.random.normal(kd, (24, 16)) / np.sqrt(24), rtol=1e-6)


def test_a_hybrid_shards_by_its_logical_axes(hybrid):
  from jtc.rl import sharding  # pylint: disable=import-outside-toplevel
  _, params = hybrid
  mesh = sharding.make_mesh(fsdp=-1)
  shardings = sharding.param_shardings(params, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(params)
