"""Tests of jtc.models.axes: every parameter of every layout (dense, qk-norm and biases, a
mixture of experts with a shared expert) gets logical axes of its rank; unknown ones are named."""
import jax
import pytest

from jtc.models import axes
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig


@pytest.mark.parametrize('config', [
    ModelConfig.tiny(qk_norm=True, attn_bias=True, tie_embeddings=False),
    ModelConfig.tiny_moe(d_shared_expert=64)
])
def test_every_parameter_has_axes_of_its_rank(config):
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
  names = axes.param_logical_axes(shapes)
  flat = jax.tree_util.tree_leaves_with_path(names, is_leaf=lambda x: isinstance(x, tuple))
  for (path, a), leaf in zip(flat, jax.tree_util.tree_leaves(shapes)):
    assert len(a) == leaf.ndim, path
    assert (a[0] == 'layers') == (path[0].key == 'layers'), path
  if config.is_moe:
    assert names['layers']['mlp']['expert_gate']['kernel'] == ('layers', 'experts', 'embed', 'mlp')
    assert names['layers']['mlp']['shared']['down']['kernel'] == ('layers', 'mlp', 'embed')


def test_unknown_parameter_is_named():
  with pytest.raises(ValueError, match=r"\['layers'\]\['mlp'\]\['mystery'\]"):
    axes.param_logical_axes({'layers': {'mlp': {'mystery': {'kernel': jax.numpy.zeros((2, 3))}}}})
