"""Tests of jtc.models.bundles: a policy bundle round-trips exactly, the shipped ones are small, and
a directory that is not a bundle is named."""
import os

import jax
import numpy as np
import pytest

from jtc.models import bundles
from jtc.models import model as model_lib


@pytest.mark.parametrize('name', sorted(bundles.SHIPPED))
def test_shipped_bundle_is_small(name):
  path = bundles.SHIPPED[name]
  assert sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) <= 20 * 2**20


def test_bundle_round_trip(tmp_path):
  bundle = bundles.load_policy_bundle('base')
  path = str(tmp_path / 'copy')
  bundles.save_policy_bundle(path, model_config=bundle.model_config, params=bundle.params,
                             tokenizer_spec=bundle.tokenizer_spec, meta=bundle.meta)
  again = bundles.load_policy_bundle(path)
  assert again.model_config == bundle.model_config
  assert model_lib.num_params(again.params) == model_lib.num_params(bundle.params)
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(bundle.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_not_a_bundle_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='not a policy bundle'):
    bundles.load_policy_bundle(str(tmp_path))
