"""The policy: model config, decoder (dense and hybrid layers), decoding caches, sampler, Hugging
Face import, tokenizers."""

# The submodules (``from jtc.models import *`` imports them).
__all__ = [
    'attention',
    'axes',
    'bundles',
    'decode',
    'decode_loop',
    'delta_rule',
    'gated_deltanet',
    'hf_architectures',
    'hf_config',
    'hf_import',
    'hf_tensors',
    'layer_types',
    'layers',
    'logprobs',
    'lora',
    'model',
    'model_config',
    'moe',
    'moe_dispatch',
    'params',
    'safetensors_io',
    'sampler',
    'tiny_checkpoint',
    'tokenizer',
]
