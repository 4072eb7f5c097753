"""Tests of jtc.models.hf_config: Hugging Face config.json <-> ModelConfig, on a real published
config and round trips of every preset."""

import pytest

from jtc.models import hf_config
from jtc.models import model as model_lib

# config.json of Qwen/Qwen3-0.6B as published on the Hugging Face Hub.
QWEN3_0_6B_CONFIG = {
    'architectures': ['Qwen3ForCausalLM'],
    'attention_bias': False,
    'attention_dropout': 0.0,
    'bos_token_id': 151643,
    'eos_token_id': 151645,
    'head_dim': 128,
    'hidden_act': 'silu',
    'hidden_size': 1024,
    'initializer_range': 0.02,
    'intermediate_size': 3072,
    'max_position_embeddings': 40960,
    'max_window_layers': 28,
    'model_type': 'qwen3',
    'num_attention_heads': 16,
    'num_hidden_layers': 28,
    'num_key_value_heads': 8,
    'rms_norm_eps': 1e-06,
    'rope_scaling': None,
    'rope_theta': 1000000,
    'sliding_window': None,
    'tie_word_embeddings': True,
    'torch_dtype': 'bfloat16',
    'transformers_version': '4.51.0',
    'use_cache': True,
    'use_sliding_window': False,
    'vocab_size': 151936
}


def test_real_qwen3_config_matches_jtc_preset():
  transformers = pytest.importorskip('transformers')
  assert hf_config.config_from_hf(QWEN3_0_6B_CONFIG) == model_lib.ModelConfig.qwen3_0_6b()
  # The exporter's config.json describes the same model again.
  config = model_lib.ModelConfig.qwen3_0_6b()
  assert hf_config.config_from_hf(hf_config.hf_config_from(config,
                                                           torch_dtype='bfloat16')) == config
  # transformers parses it into the same architecture hyper-parameters.
  hf = transformers.Qwen3Config(**hf_config.hf_config_from(config))
  assert (hf.head_dim, hf.num_key_value_heads, hf.tie_word_embeddings) == (128, 8, True)


PRESETS = ('tiny', 'small_25m', 'qwen3_0_6b', 'qwen3_1_7b', 'qwen3_8b', 'llama3_1b')


@pytest.mark.parametrize('preset', PRESETS)
def test_every_preset_round_trips_through_config_json(preset):
  config = getattr(model_lib.ModelConfig, preset)()
  hf = hf_config.hf_config_from(config, torch_dtype=config.param_dtype)
  assert hf['architectures'] == [hf_config.architecture_for(config)]
  assert hf_config.config_from_hf(hf) == config


def test_an_unsupported_architecture_is_named():
  hf = hf_config.hf_config_from(model_lib.ModelConfig.qwen3_0_6b())
  with pytest.raises(hf_config.CheckpointError, match='MistralForCausalLM'):
    hf_config.config_from_hf(dict(hf, architectures=['MistralForCausalLM'], model_type='mistral'))
