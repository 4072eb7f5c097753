"""Tests of jtc.models.hf_architectures: each family's flags from a config.json, the hybrids'
layer types, and the architecture a config exports as (the families' parity with transformers
is tested in test_hf_import.py and test_hf_tensors.py)."""
import pytest

from jtc.models import hf_architectures
from jtc.models.model_config import ModelConfig

L, F = 'linear_attention', 'full_attention'
TEXT = dict(num_hidden_layers=6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
            shared_expert_intermediate_size=8)


def test_the_hybrids_flags():
  hf = dict(TEXT, architectures=['Qwen3NextForCausalLM'], partial_rotary_factor=0.5,
            linear_num_key_heads=2, full_attention_interval=3)
  flags = hf_architectures.SUPPORTED_ARCHITECTURES[hf_architectures.architecture(hf)](hf)
  assert flags['layer_types'] == (L, L, F, L, L, F)
  assert flags['partial_rotary_factor'] == 0.5 and flags['linear_n_k_heads'] == 2
  assert flags['linear_n_v_heads'] == 32  # Hugging Face's default where the key is absent
  assert flags['n_experts'] == 4 and flags['d_shared_expert'] == 8
  qwen3_5 = hf_architectures.SUPPORTED_ARCHITECTURES['Qwen3_5ForCausalLM'](dict(TEXT))
  assert 'n_experts' not in qwen3_5 and qwen3_5['layer_types'][3] == F


@pytest.mark.parametrize('update, pattern', [
    (dict(shared_expert_intermediate_size=0), 'shared_expert_intermediate_size > 0'),
    (dict(mlp_only_layers=[1]), 'dense layers among sparse ones'),
    (dict(attention_bias=True), 'attention_bias=True'),
])
def test_a_qwen3_next_jtc_cannot_represent_is_named(update, pattern):
  with pytest.raises(hf_architectures.CheckpointError, match=pattern):
    hf_architectures.SUPPORTED_ARCHITECTURES['Qwen3NextForCausalLM'](dict(TEXT, **update))


def test_the_architecture_a_config_exports_as():
  assert hf_architectures.architecture_for(ModelConfig.tiny_hybrid()) == 'Qwen3_5ForCausalLM'
  nxt = ModelConfig.tiny_hybrid(n_experts=4, experts_per_token=2, d_expert=8, d_shared_expert=8)
  assert hf_architectures.architecture_for(nxt) == 'Qwen3NextForCausalLM'
  with pytest.raises(ValueError, match='d_shared_expert=0'):
    hf_architectures.architecture_for(
        ModelConfig.tiny_hybrid(n_experts=4, experts_per_token=2, d_expert=8))
  with pytest.raises(ValueError, match='attn_output_gate=False'):
    hf_architectures.architecture_for(ModelConfig.tiny_hybrid(attn_output_gate=False))
  assert hf_architectures.architecture_for(ModelConfig.tiny(qk_norm=True)) == 'Qwen3ForCausalLM'
