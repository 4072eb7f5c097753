"""The policy: model config, decoder, decoding caches, sampler, Hugging Face import, tokenizers."""

# The submodules (``from jtc.models import *`` imports them).
__all__ = [
    'attention',
    'axes',
    'bundles',
    'decode',
    'decode_loop',
    'hf_config',
    'hf_import',
    'layers',
    'logprobs',
    'lora',
    'model',
    'model_config',
    'moe',
    'safetensors_io',
    'sampler',
    'tiny_checkpoint',
    'tokenizer',
]
