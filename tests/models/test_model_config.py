"""Tests of jtc.models.model_config: validation names the bad field; presets have the sizes of their
model cards."""
import jax
import pytest

from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig


@pytest.mark.parametrize('field,value', [('n_kv_heads', 3), ('head_dim', 7), ('dtype', 'fp16'),
                                         ('param_dtype', 'float64'), ('d_model', 0),
                                         ('rope_theta', -1.0), ('qk_norm', 1),
                                         ('rope_scaling', 'yarn'), ('rope_factor', 0.0)])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    ModelConfig.tiny(**{field: value})


@pytest.mark.parametrize('overrides, pattern', [
    (dict(experts_per_token=9), r'experts_per_token=9 must be in \[1, n_experts=8\]'),
    (dict(experts_per_token=0), r'experts_per_token=0'),
    (dict(d_expert=0), 'd_expert must be > 0'),
    (dict(n_experts=-1), 'n_experts must be an int >= 0'),
    (dict(moe_impl='capacity'), r"moe_impl='capacity' is not one of \['ragged', 'dense'\]"),
    (dict(norm_topk_prob=1), 'norm_topk_prob must be a bool'),
])
def test_moe_validation_names_field(overrides, pattern):
  with pytest.raises(ValueError, match=pattern):
    ModelConfig.tiny_moe(**overrides)


@pytest.mark.parametrize('preset,non_embedding', [('qwen3_0_6b', 0.44e9), ('qwen3_1_7b', 1.4e9),
                                                  ('qwen3_8b', 6.95e9), ('llama3_1b', 0.97e9),
                                                  ('qwen3_30b_a3b', 29.9e9),
                                                  ('qwen3_235b_a22b', 234e9)])
def test_preset_sizes_match_model_cards(preset, non_embedding):
  """Non-embedding parameter counts as published on the model cards (within 2%)."""
  config = getattr(ModelConfig, preset)()
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
  n = model_lib.num_params(
      shapes) - config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
  assert abs(n / non_embedding - 1) < 0.02, n


def test_tiny_and_small_presets():
  assert ModelConfig.tiny().vocab_size == 64 and ModelConfig.tiny(vocab_size=100).vocab_size == 100
  shapes = jax.eval_shape(lambda: model_lib.init_params(ModelConfig.small_25m(), jax.random.key(0)))
  assert 22e6 < model_lib.num_params(shapes) < 28e6
