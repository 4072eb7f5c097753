"""Tests of jtc.models.hf_config: Hugging Face config.json <-> ModelConfig, on a real published
config and round trips of every preset."""

import dataclasses
import re

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


def test_moe_export_needs_an_hf_architecture():
  """A mixture of experts without qk-norm and without a shared expert has no HF class."""
  config = dataclasses.replace(model_lib.ModelConfig.qwen3_30b_a3b(), qk_norm=False)
  with pytest.raises(ValueError, match='Qwen3MoeForCausalLM.*Qwen2MoeForCausalLM'):
    hf_config.hf_config_from(config)


# config.json of Qwen/Qwen3-30B-A3B as published on the Hugging Face Hub.
QWEN3_30B_A3B_CONFIG = {
    'architectures': ['Qwen3MoeForCausalLM'],
    'attention_bias': False,
    'attention_dropout': 0.0,
    'bos_token_id': 151643,
    'decoder_sparse_step': 1,
    'eos_token_id': 151645,
    'head_dim': 128,
    'hidden_act': 'silu',
    'hidden_size': 2048,
    'initializer_range': 0.02,
    'intermediate_size': 6144,
    'max_position_embeddings': 40960,
    'max_window_layers': 48,
    'mlp_only_layers': [],
    'model_type': 'qwen3_moe',
    'moe_intermediate_size': 768,
    'norm_topk_prob': True,
    'num_attention_heads': 32,
    'num_experts': 128,
    'num_experts_per_tok': 8,
    'num_hidden_layers': 48,
    'num_key_value_heads': 4,
    'output_router_logits': False,
    'rms_norm_eps': 1e-06,
    'rope_scaling': None,
    'rope_theta': 1000000.0,
    'router_aux_loss_coef': 0.001,
    'sliding_window': None,
    'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16',
    'transformers_version': '4.51.0',
    'use_cache': True,
    'use_sliding_window': False,
    'vocab_size': 151936
}


def test_real_qwen3_moe_config_matches_jtc_preset():
  transformers = pytest.importorskip('transformers')
  config = model_lib.ModelConfig.qwen3_30b_a3b()
  assert hf_config.config_from_hf(QWEN3_30B_A3B_CONFIG) == config
  again = hf_config.hf_config_from(config, torch_dtype='bfloat16')
  assert hf_config.config_from_hf(again) == config
  hf = transformers.Qwen3MoeConfig(**again)
  assert (hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
          hf.norm_topk_prob) == (128, 8, 768, True)
  # transformers 5 writes the expert count as num_local_experts: read too.
  renamed = {k: v for k, v in QWEN3_30B_A3B_CONFIG.items() if k != 'num_experts'}
  assert hf_config.config_from_hf({**renamed, 'num_local_experts': 128}) == config


@pytest.mark.parametrize('update, patterns', [
    (dict(num_experts_per_tok=129), ['num_experts_per_tok=129', r'\[1, num_experts=128\]']),
    (dict(mlp_only_layers=[0, 47]),
     [r'mlp_only_layers=\[0, 47\]', 'not supported yet', 'decoder_sparse_step=1']),
    (dict(decoder_sparse_step=2), ['decoder_sparse_step=2', 'every layer sparse']),
    (dict(num_experts=0), ['num_experts=0', 'num_experts > 0']),
    (dict(num_local_experts=64), ['num_experts', 'num_local_experts', 'disagree']),
    (dict(num_experts_per_tok=None), ['missing', 'num_experts_per_tok']),
])
def test_bad_moe_config_names_the_key(update, patterns):
  bad = {k: v for k, v in {**QWEN3_30B_A3B_CONFIG, **update}.items() if v is not None}
  with pytest.raises(hf_config.CheckpointError) as info:
    hf_config.config_from_hf(bad)
  for pattern in patterns:
    assert re.search(pattern, str(info.value)), (pattern, info.value)
