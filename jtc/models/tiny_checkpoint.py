"""A random tiny Hugging Face checkpoint with a tokenizer, for smoke runs of the real-model
configs without downloading a model (`jtc tiny-checkpoint OUT --like qwen3`).

`write(path, like=...)` writes ``config.json`` and ``model.safetensors``
(`hf_import.export_hf_checkpoint`, bfloat16 on disk) and a byte-level tokenizer with a ChatML
chat template and eos / pad tokens (`tokenizer.write_byte_level_hf`): what
``--config.policy.checkpoint`` reads, and what ``transformers.AutoModelForCausalLM`` loads. The
weights are random (N(0, 1/fan_in), seeded): a smoke run checks the code path, never a result.
"""
from __future__ import annotations

import jax

from jtc.models import hf_import
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib

# The byte-level tokenizer's vocabulary: 256 bytes and 3 special tokens, rounded up to 272.
VOCAB_SIZE = 272
# --like: the architecture's distinguishing settings (hf_architectures.architecture_for reads
# them); 'preset' names the `ModelConfig` preset they modify (default `tiny`, 2 layers).
LIKE = {
    'qwen3':
        dict(qk_norm=True, attn_bias=False),  # Qwen3ForCausalLM
    'qwen2':
        dict(qk_norm=False, attn_bias=True),  # Qwen2ForCausalLM
    'llama':
        dict(qk_norm=False, attn_bias=False),  # LlamaForCausalLM
    # Qwen3_5ForCausalLM: 3 Gated DeltaNet layers, then 1 gated full attention.
    'qwen3_5':
        dict(preset='tiny_hybrid', n_layers=4),
    # Qwen3NextForCausalLM: the same hybrid with 4 experts of 64 (2 per token) and a shared one.
    'qwen3_next':
        dict(preset='tiny_hybrid', n_layers=4, n_experts=4, experts_per_token=2, d_expert=64,
             d_shared_expert=64, norm_topk_prob=True, moe_impl='blocks'),
}


def model_config(like: str = 'qwen3', **overrides) -> model_lib.ModelConfig:
  """The tiny model of architecture ``like``: 2 layers (the hybrids 4), d_model 128, 4 heads
  (2 kv), d_ff 256."""
  if like not in LIKE:
    raise ValueError(f'unknown architecture {like!r}; valid: {sorted(LIKE)}')
  settings = {**dict(preset='tiny', n_layers=2), **LIKE[like], **overrides}
  preset = getattr(model_lib.ModelConfig, settings.pop('preset'))
  return preset(vocab_size=VOCAB_SIZE, d_ff=256, **settings)


def write(path: str, *, like: str = 'qwen3', seed: int = 0) -> model_lib.ModelConfig:
  """Writes the random tiny checkpoint of architecture ``like`` and its tokenizer to ``path``;
  returns its `ModelConfig`."""
  config = model_config(like)
  params = model_lib.init_params(config, jax.random.key(seed))
  tokenizer_lib.write_byte_level_hf(path)
  hf_import.export_hf_checkpoint(config, params, path, torch_dtype='bfloat16')
  return config
