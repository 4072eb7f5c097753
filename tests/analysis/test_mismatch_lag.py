"""`jtc.analysis.mismatch_lag`: the mismatch split by the tokens' policy lag. Known positive: rows
whose tokens were drawn by versions 0, 1 and 2 of a policy that changed between versions,
scored by version 2: lag 0 reads zero and mean |delta| grows with the lag. Negative: the same
rows with no parameter change between versions: every lag reads zero in float32. The buckets
and their shares against a count by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import mismatch_lag
from jtc.models import logprobs
from jtc.models import model as model_lib

CONFIG = model_lib.ModelConfig.tiny(vocab_size=31, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                    head_dim=8, d_ff=48, dtype='float32')
B, P, T = 6, 3, 9


@pytest.fixture(scope='module')
def rows():
  """Tokens, masks and each token's version (a row continued under newer versions, as partial
  rollouts continue it: versions non-decreasing along the row)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, CONFIG.vocab_size, size=(B, P + T)).astype(np.int32)
  mask_BT = (np.arange(T)[None] < rng.integers(4, T + 1, size=(B, 1))).astype(np.int32)
  versions_BT = np.sort(rng.integers(0, 3, size=(B, T)), axis=1)
  versions_BT = np.where(mask_BT > 0, versions_BT, mismatch_lag.NO_VERSION).astype(np.int32)
  input_mask = np.concatenate([np.ones((B, P), np.int32), mask_BT], axis=1)
  return jnp.asarray(tokens), jnp.asarray(input_mask), mask_BT, versions_BT


def _by_lag(rows, step_scale):
  """`by_lag` of rows whose token of version v was drawn by params_v = params_0 + v x
  ``step_scale`` x noise (its sampler log-prob under params_v), scored by version 2."""
  tokens, input_mask, mask_BT, versions_BT = rows
  params = model_lib.init_params(CONFIG, jax.random.key(0))
  noise = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype), params)
  version = lambda v: jax.tree.map(lambda p, n: p + v * step_scale * n, params, noise)
  score = jax.jit(lambda p: logprobs.sequence_logprobs(p, CONFIG, tokens, input_mask,
                                                       completion_start=P)['logps'])
  logps_VBT = np.stack([np.asarray(score(version(v))) for v in range(3)])
  sampler_BT = np.take_along_axis(logps_VBT, np.maximum(versions_BT, 0)[None], axis=0)[0]
  lag_BT = mismatch_lag.lag_BT(versions_BT, 2)
  return mismatch_lag.by_lag(logps_VBT[2], sampler_BT, mask_BT, lag_BT), lag_BT


def test_mismatch_grows_with_the_lag_when_the_policy_changed(rows):
  got, _ = _by_lag(rows, 0.02)
  assert got['lag0/mean_abs'] == 0.0 and got['lag0/max_abs'] == 0.0  # drawn by the scorer
  assert 0 < got['lag1/mean_abs'] < got['lag2+/mean_abs']
  assert got['lag1/p99_abs'] < got['lag2+/p99_abs']


def test_every_lag_reads_zero_without_a_parameter_change(rows):
  got, lag_BT = _by_lag(rows, 0.0)
  for name in mismatch_lag.BUCKETS:
    assert got[f'lag{name}/mean_abs'] == 0.0 and got[f'lag{name}/max_abs'] == 0.0
  # The shares of the real tokens per bucket, by hand.
  real = rows[2] > 0
  for k, name in enumerate(mismatch_lag.BUCKETS):
    assert got[f'lag{name}/tokens'] == pytest.approx(np.sum(real & (lag_BT == k)) / real.sum())


def test_lags_are_bucketed_and_a_newer_token_is_refused():
  versions = np.array([[-1, 5, 4, 3, 0]])
  np.testing.assert_array_equal(mismatch_lag.lag_BT(versions, 5), [[-1, 0, 1, 2, 2]])
  with pytest.raises(ValueError, match='newer than the scoring policy version 4'):
    mismatch_lag.lag_BT(versions, 4)
  # A bucket without tokens reports its share (0) and no metric.
  got = mismatch_lag.by_lag(np.zeros((1, 5)), np.zeros((1, 5)), np.ones((1, 5)),
                            np.array([[0, 0, 2, 2, 2]]))
  assert got['lag1/tokens'] == 0.0 and 'lag1/mean_abs' not in got and got['lag2+/tokens'] == 0.6
