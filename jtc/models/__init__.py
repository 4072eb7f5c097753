"""The policy: model config, decoder, decoding caches, sampler, Hugging Face import, tokenizers."""

# The submodules (``from jtc.models import *`` imports them).
__all__ = [
    'attention',
    'bundles',
    'decode',
    'hf_config',
    'hf_import',
    'layers',
    'logprobs',
    'lora',
    'model',
    'model_config',
    'sampler',
    'tiny_checkpoint',
    'tokenizer',
]
