"""Tests of jtc.models.decode_loop: the continuous scheduler draws, token for token, what the
static one draws for the same key, whatever its slot count (rows of different lengths, some
ended by EOS and some at T, rows restarted in slots that other rows left); a row's draws are
keyed by (row, token index) only; idle slots write nothing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import decode_loop
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib

CONFIG = model_lib.ModelConfig.tiny(vocab_size=23, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                    head_dim=8, d_ff=48, qk_norm=True)
PAD, EOS_IDS = 0, (5,)
PROMPTS = [[5, 9, 14, 2], [7], [3, 11, 6, 8, 20, 4]]
G, T = 3, 12


@pytest.fixture(scope='module')
def static_run():
  params = model_lib.init_params(CONFIG, jax.random.key(0))
  tokens_BP = np.zeros((3, 6), np.int32)
  mask_BP = np.zeros((3, 6), np.int32)
  for b, row in enumerate(PROMPTS):
    tokens_BP[b, 6 - len(row):], mask_BP[b, 6 - len(row):] = row, 1
  kw = dict(rng=jax.random.key(3), num_samples=G, max_new_tokens=T, eos_id=EOS_IDS, pad_id=PAD,
            temperature=1.0, block_size=4)
  run = lambda **more: sampler_lib.sample(params, CONFIG, jnp.asarray(tokens_BP),
                                          jnp.asarray(mask_BP), **kw, **more)
  return run, run(scheduler='static')


@pytest.mark.parametrize('slots', [1, 4])
def test_continuous_draws_what_static_draws_whatever_the_slots(static_run, slots):
  run, want = static_run
  lengths = np.asarray(want.completion_mask_RT).sum(1)
  assert len(set(lengths.tolist())) >= 3 and 0 < np.asarray(want.truncated_R).sum() < G * 3
  got = run(scheduler='continuous', slots=slots)
  for name in ('tokens_RL', 'input_mask_RL', 'completion_RT', 'completion_mask_RT', 'truncated_R'):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  np.testing.assert_allclose(got.logps_RT, want.logps_RT, rtol=1e-5, atol=1e-5)


def test_token_keys_depend_on_row_and_token_index_only():
  rng = jax.random.key(0)
  keys = decode_loop.token_keys(rng, jnp.array([4, 4, 0]), jnp.array([7, 2, 7]))
  want = [jax.random.fold_in(jax.random.fold_in(rng, t), r) for t, r in ((4, 7), (4, 2), (0, 7))]
  for got, w in zip(keys, want):
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(w))


def test_completions_write_drops_idle_slots():
  out = decode_loop.Completions.empty(3, 1, 4, PAD)  # 3 prompts x 1 sample
  out = out.write(jnp.array([2, 3, 0]), jnp.array([1, 0, 3]), jnp.array([9, 8, 2]),
                  jnp.array([-0.5, -1.0, -2.0]), jnp.array([False, True, True]))
  np.testing.assert_array_equal(out.tokens_BGT[:, 0], [[0, 0, 0, 2], [0, 0, 0, 0], [0, 9, 0, 0]])
  np.testing.assert_array_equal(out.mask_BGT[:, 0], [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
  np.testing.assert_array_equal(out.logps_BGT[0, 0, 3], -2.0)
  np.testing.assert_array_equal(out.eos_BG[:, 0], [True, False, False])  # slot 1 (row 3) is idle
