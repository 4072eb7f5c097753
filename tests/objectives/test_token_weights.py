"""Tests of jtc.objectives.token_weights: the token cloud's running means across steps."""
import jax
import jax.numpy as jnp
import numpy as np

from jtc.objectives import token_weights
from tests.objectives.delta_reference import B, T


def test_token_cloud_accumulates_means_across_steps():
  r = np.random.default_rng(22)
  vocab = 11
  state = token_weights.init_token_cloud(vocab)
  update = jax.jit(token_weights.update_token_cloud)
  sums, counts = np.zeros(vocab), np.zeros(vocab)
  for _ in range(3):
    ids = r.integers(0, vocab, size=(B, T))
    lam = r.uniform(0.5, 1.5, size=(B, T))
    mask = r.uniform(size=(B, T)) > 0.3
    state = update(state, jnp.asarray(ids), jnp.asarray(lam, jnp.float32), jnp.asarray(mask))
    for i in range(B):
      for t in range(T):
        if mask[i, t]:
          sums[ids[i, t]] += lam[i, t]
          counts[ids[i, t]] += 1
  np.testing.assert_allclose(state.count_V, counts)
  np.testing.assert_allclose(state.lam_sum_V, sums, rtol=1e-5)
  out = token_weights.top_bottom_tokens(state, 3, min_count=2)
  means = np.where(counts >= 2, sums / np.maximum(counts, 1), np.nan)
  order = [i for i in np.argsort(-np.nan_to_num(means, nan=-np.inf)) if counts[i] >= 2]
  np.testing.assert_array_equal(np.asarray(out['top_ids']), order[:3])
  np.testing.assert_allclose(out['top_mean'], means[order[:3]], rtol=1e-5)
  order_b = [i for i in np.argsort(np.nan_to_num(means, nan=np.inf)) if counts[i] >= 2]
  np.testing.assert_array_equal(np.asarray(out['bottom_ids']), order_b[:3])
  assert np.all(np.asarray(out['top_count']) >= 2)
