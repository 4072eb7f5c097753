"""benchmarks/rollout.py's long-tailed test policy: every next token uniform over the V ids (its
LM head is zero), k = V / mean of them EOS, so lengths are geometric with the stated mean."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import rollout as bench
from jtc.models import model as model_lib


@pytest.mark.slow  # ~15 s here under load: a benchmark's instrument, not the library's
def test_the_test_policy_draws_uniform_tokens_and_v_over_mean_eos_ids():
  config = model_lib.ModelConfig.tiny(vocab_size=64, tie_embeddings=False)
  params, eos_ids = bench.long_tail_policy(config, mean=8)
  assert eos_ids == tuple(range(1, 9)) and bench.PAD not in eos_ids
  tokens = jnp.asarray(np.random.default_rng(0).integers(9, 64, (3, 5)), jnp.int32)
  mask = jnp.ones_like(tokens)
  logits = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask),
                             mask).logits_BLV
  np.testing.assert_allclose(jax.nn.softmax(logits), 1 / 64, rtol=1e-6)  # P(EOS) = 8 / 64
  named = bench.systems(16, [16, 8, 4, 0, 32])
  assert list(named) == [
      'static', 'continuous slots=16', 'continuous slots=8', 'continuous slots=4'
  ]
