"""The policy: model config, decoder, decoding caches, sampler, Hugging Face import, tokenizers."""
