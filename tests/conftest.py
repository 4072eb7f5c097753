"""Shared pytest set-up: CPU only, float32 matmuls, deterministic."""
import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')

import jax  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')
