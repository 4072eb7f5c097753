"""Tests of jtc.models.decode_loop: the continuous scheduler draws, token for token, what the
static one draws for the same key, whatever its slot count (rows of different lengths, some
ended by EOS and some at T, rows restarted in slots that other rows left; a hybrid's:
tests/models/test_hybrid.py); a row's draws are keyed by (row, token index) only; idle slots
write nothing; a slot's bytes are those its cache holds per row (dense and hybrid)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import decode
from jtc.models import decode_loop
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib

CONFIG = model_lib.ModelConfig.tiny(vocab_size=23, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                    head_dim=8, d_ff=48, qk_norm=True)
HYBRID = model_lib.ModelConfig.tiny_hybrid(vocab_size=23, d_model=16, n_heads=2, n_kv_heads=1,
                                           head_dim=8, d_ff=32, linear_n_k_heads=1,
                                           linear_n_v_heads=2, linear_k_head_dim=8,
                                           linear_v_head_dim=6, linear_chunk=4)
PAD, EOS_IDS = 0, (5,)
PROMPTS = [[5, 9, 14, 2], [7], [3, 11, 6, 8, 20, 4]]
G, T = 3, 12


@pytest.fixture(scope='module')
def setup():
  params = model_lib.init_params(CONFIG, jax.random.key(0))
  tokens_BP = np.zeros((3, 6), np.int32)
  mask_BP = np.zeros((3, 6), np.int32)
  for b, row in enumerate(PROMPTS):
    tokens_BP[b, 6 - len(row):], mask_BP[b, 6 - len(row):] = row, 1
  kw = dict(num_samples=G, max_new_tokens=T, eos_id=EOS_IDS, pad_id=PAD, block_size=4)
  return params, tokens_BP, mask_BP, kw


@pytest.fixture(scope='module')
def static_run(setup):
  params, tokens_BP, mask_BP, kw = setup
  run = lambda **more: sampler_lib.sample(params, CONFIG, jnp.asarray(
      tokens_BP), jnp.asarray(mask_BP), rng=jax.random.key(3), temperature=1.0, **kw, **more)
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


@pytest.mark.parametrize('config', [CONFIG, HYBRID], ids=['dense', 'hybrid'])
def test_a_slots_bytes_are_what_its_cache_holds_per_row(config):
  """`row_bytes` less its three float32 [V] rows = the per-row fields (completion keys and
  values, a hybrid's linear states) of a 3-slot cache from `decode.prefill`, over 3 (shapes)."""
  params = jax.eval_shape(lambda k: model_lib.init_params(config, k), jax.random.key(0))
  prompts = jax.ShapeDtypeStruct((2, 6), jnp.int32)
  _, cache = jax.eval_shape(
      lambda p, t: decode.prefill(p, config, t, t, num_samples=G, max_new_tokens=T, block_size=4,
                                  slots=3), params, prompts)
  per_row = [cache.k_YRKHT, cache.v_YRKTH] + jax.tree.leaves(cache.linear)
  assert (cache.linear is None) == (config is CONFIG)
  want = sum(x.size * x.dtype.itemsize for x in per_row) // 3
  assert decode_loop.row_bytes(config, T, 4) - 3 * 4 * config.vocab_size == want


def test_token_keys_depend_on_row_and_token_index_only():
  rng = jax.random.key(0)
  keys = decode_loop.token_keys(rng, jnp.array([4, 4, 0]), jnp.array([7, 2, 7]))
  want = [jax.random.fold_in(jax.random.fold_in(rng, t), r) for t, r in ((4, 7), (4, 2), (0, 7))]
  for got, w in zip(keys, want):
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(w))


def test_completions_write_drops_idle_slots():
  out = decode_loop.Completions.empty(3, 1, 4, PAD)  # 3 prompts x 1 sample
  out = out.write(jnp.array([2, 3, 0]), jnp.array([1, 0, 3]), jnp.array([9, 8, 2]),
                  jnp.array([-0.5, -1.0, -2.0]), jnp.array([False, True, True]),
                  jnp.array([False, True, True]))
  np.testing.assert_array_equal(out.tokens_BGT[:, 0], [[0, 0, 0, 2], [0, 0, 0, 0], [0, 9, 0, 0]])
  np.testing.assert_array_equal(out.mask_BGT[:, 0], [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
  np.testing.assert_array_equal(out.logps_BGT[0, 0, 3], -2.0)
  np.testing.assert_array_equal(out.eos_BG[:, 0], [True, False, False])  # slot 1 (row 3) is idle


@pytest.mark.slow
def test_a_call_stopped_after_k_steps_then_resumed_from_its_prefixes_draws_the_whole_run(setup):
  """max_decode_steps=3 with 8 slots for 9 rows: every row's tokens so far are those of the run
  without the stop (keys are per row and token index); rows not ended come back unfinished
  (prompt 2's three rows end at their second token, one of them started late). Greedy, each
  unfinished row continued as its own prompt (the prompt, then its tokens so far: re-prefilled)
  with the budget it has left draws the rest of the run's row, with its log-probs."""
  params, tokens_BP, mask_BP, kw = setup
  kw = dict(kw, rng=jax.random.key(3), greedy=True, scheduler='continuous', slots=8, eos_id=2)

  def run(tokens, mask, **more):
    return sampler_lib.sample(params, CONFIG, jnp.asarray(tokens), jnp.asarray(mask),
                              **dict(kw, **more))

  whole = run(tokens_BP, mask_BP)
  part = run(tokens_BP, mask_BP, max_decode_steps=3)
  got_mask = np.asarray(part.completion_mask_RT)
  np.testing.assert_array_equal(np.where(got_mask, part.completion_RT, PAD),
                                np.where(got_mask, whole.completion_RT, PAD))
  np.testing.assert_allclose(part.logps_RT, np.where(got_mask, whole.logps_RT, 0.0), atol=1e-5)
  unfinished = np.flatnonzero(~np.asarray(part.finished_R))
  np.testing.assert_array_equal(unfinished, np.arange(6))
  assert (got_mask[:6].sum(1) == 4).all() and not np.asarray(part.truncated_R).any()
  # Each unfinished row as its own prompt, left-padded to P + T.
  W = 6 + T
  prompts, masks = np.zeros((6, W), np.int32), np.zeros((6, W), np.int32)
  for r in unfinished:
    seq = np.asarray(part.tokens_RL[r])[np.asarray(part.input_mask_RL[r]) > 0]
    prompts[r, W - len(seq):], masks[r, W - len(seq):] = seq, 1
  rest = run(prompts, masks, num_samples=1, slots=6, max_new_tokens_B=jnp.full(6, T - 4))
  np.testing.assert_array_equal(rest.completion_RT[:, :T - 4], whole.completion_RT[:6, 4:])
  np.testing.assert_allclose(rest.logps_RT[:, :T - 4], whole.logps_RT[:6, 4:], atol=1e-4)
  np.testing.assert_array_equal(rest.completion_mask_RT.sum(1), T - 4)
  assert np.asarray(rest.finished_R).all()
