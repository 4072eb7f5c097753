"""Tiny random hybrid checkpoints written by `transformers` (torch, CPU, float32): a Qwen3.5
(`Qwen3_5ForCausalLM`: Gated DeltaNet + gated attention, dense MLP) and a Qwen3-Next
(`Qwen3NextForCausalLM`: the same hybrid with a mixture of experts and a shared expert).

The norms, gates and decay rates are perturbed away from their initialisation so that a wrongly
mapped one shows up in the logits. Shared by the parity tests (tests/models/test_hf_tensors.py)
and the per-token instruments on imported hybrids (tests/analysis/test_hybrid_cancellation.py).
"""
import pytest

transformers = pytest.importorskip('transformers')
torch = pytest.importorskip('torch')

L, F = 'linear_attention', 'full_attention'

# Shapes shared by both architectures: 2 key / 4 value heads of 8 / 12 in the linear layers,
# 4 query / 2 kv heads of 16 in the full-attention ones.
_COMMON = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
               linear_value_head_dim=12, tie_word_embeddings=False, initializer_range=0.1,
               rms_norm_eps=1e-5)


def _perturbed(model):
  with torch.no_grad():
    for key, p in model.named_parameters():
      if 'norm' in key or 'dt_bias' in key:
        p.add_(0.3 * torch.randn_like(p))
  return model.eval()


def write_qwen3_5(directory, *, vocab_size=96, layer_types=(L, L, F, L, F), seed=0):
  """Writes a tiny random `Qwen3_5ForCausalLM` (RoPE on half of each head) to ``directory``;
  returns the torch model."""
  torch.manual_seed(seed)
  hf_config = transformers.Qwen3_5TextConfig(
      vocab_size=vocab_size, num_hidden_layers=len(layer_types), layer_types=list(layer_types),
      rope_parameters=dict(rope_type='default', rope_theta=1000.0,
                           partial_rotary_factor=0.5), **_COMMON)
  hf_config._attn_implementation = 'eager'
  model = _perturbed(transformers.Qwen3_5ForCausalLM(hf_config))
  model.save_pretrained(directory)
  return model


def write_qwen3_next(directory, *, vocab_size=96, layer_types=(L, L, F, L), seed=2):
  """Writes a tiny random `Qwen3NextForCausalLM` (4 experts of 16, 2 per token, a shared expert
  of 24 in every layer) to ``directory``; returns the torch model."""
  torch.manual_seed(seed)
  hf_config = transformers.Qwen3NextConfig(vocab_size=vocab_size,
                                           num_hidden_layers=len(layer_types),
                                           layer_types=list(layer_types), num_experts=4,
                                           num_experts_per_tok=2, moe_intermediate_size=16,
                                           shared_expert_intermediate_size=24, **_COMMON)
  hf_config._attn_implementation = 'eager'
  model = _perturbed(transformers.Qwen3NextForCausalLM(hf_config))
  model.save_pretrained(directory)
  return model
