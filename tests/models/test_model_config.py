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
    (dict(moe_impl='capacity'),
     r"moe_impl='capacity' is not one of \['ragged', 'dense', 'blocks'\]"),
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


@pytest.mark.parametrize('overrides, pattern', [
    (dict(layer_types=('linear_attention', 'sliding_attention', 'full_attention',
                       'full_attention')), "unknown layer type 'sliding_attention'"),
    (dict(layer_types=('full_attention',) * 3), 'layer_types has 3 entries.*n_layers=4'),
    (dict(linear_n_v_heads=3), 'linear_n_v_heads=3 must be divisible by .*linear_n_k_heads=2'),
    (dict(partial_rotary_factor=0.1), 'partial_rotary_factor=0.1'),
    (dict(ffn_types=('mlp', 'moe', 'mlp', 'mlp'), n_experts=4, experts_per_token=1,
          d_expert=8), 'mixes dense and mixture-of-experts'),
    (dict(ffn_types=('moe',) * 4), "'moe' layers but n_experts=0"),
])
def test_hybrid_validation_names_field(overrides, pattern):
  with pytest.raises(ValueError, match=pattern):
    ModelConfig.tiny_hybrid(**overrides)


def test_hybrid_presets():
  """Every 4th layer full attention; Qwen3-Next-80B-A3B has 80B parameters in total (its model
  card), within 2%."""
  for preset in ('qwen3_5_0_8b', 'qwen3_5_2b', 'qwen3_5_9b', 'qwen3_next_80b_a3b'):
    config = getattr(ModelConfig, preset)()
    assert config.layer_types[3::4] == ('full_attention',) * (config.n_layers // 4), preset
    assert config.rotary_dim == 64 and config.attn_output_gate and config.norm_zero_centered
  config = ModelConfig.qwen3_next_80b_a3b()
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
  assert abs(model_lib.num_params(shapes) / 80e9 - 1) < 0.02
  assert ModelConfig(**{**config.__dict__, 'layer_types': list(config.layer_types)}) == config
