"""Tests of jtc.models.decode: prefill and teacher-forced decode steps give the logits of one full
forward pass of the same sequences, for groups of rows sharing a prompt block, across several
cache blocks, in both layer layouts (scanned, and `split_layers` / `split_cache`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import decode
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig

G, P, T, BLOCK = 2, 5, 5, 2  # T = 5 new tokens in blocks of 2 slots: three blocks, the last partial


@pytest.fixture(scope='module')
def setup():
  config = ModelConfig.tiny(vocab_size=29, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                            head_dim=8, d_ff=48)
  params = model_lib.init_params(config, jax.random.key(0))
  prompt_BP = jnp.array([[0, 0, 7, 3, 11], [4, 9, 2, 8, 1]], jnp.int32)  # left-padded
  mask_BP = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)
  completion_RT = jax.random.randint(jax.random.key(1), (2 * G, T), 1, 29)  # each row its own
  return config, params, prompt_BP, mask_BP, completion_RT


def _full_forward_logits(config, params, prompt_BP, mask_BP, completion_RT):
  """[R, T, V]: logits after the prompt and each completion token, one forward pass per row's
  whole sequence (the reference)."""
  tokens_RL = jnp.concatenate([jnp.repeat(prompt_BP, G, axis=0), completion_RT], axis=1)
  mask_RL = jnp.concatenate([jnp.repeat(mask_BP, G, axis=0), jnp.ones_like(completion_RT)], axis=1)
  out = model_lib.forward(params, config, tokens_RL, model_lib.positions_from_mask(mask_RL),
                          mask_RL)
  return out.logits_BLV[:, P - 1:-1]


def _decoded_logits(config, params, prompt_BP, mask_BP, completion_RT, *, split):
  """[R, T, V]: prefill's logits, then those of decode steps fed the completion tokens."""
  first_BV, cache = decode.prefill(params, config, prompt_BP, mask_BP, num_samples=G,
                                   max_new_tokens=T, block_size=BLOCK)
  if split:
    params, cache = decode.split_layers(params), decode.split_cache(cache)
  step = jax.jit(
      lambda p, tok, pos, cache: decode.decode_step(p, config, tok, pos, cache, block_size=BLOCK))
  positions_R = jnp.repeat(jnp.sum(mask_BP, axis=1), G)  # the first new token's position
  logits = [jnp.repeat(first_BV, G, axis=0)]
  for t in range(T - 1):
    logits_RV, cache = step(params, completion_RT[:, t], positions_R + t, cache)
    assert int(cache.length) == t + 1
    logits.append(logits_RV)
  return jnp.stack(logits, axis=1)


@pytest.mark.parametrize('split', [False, True])
def test_prefill_and_decode_steps_equal_one_full_forward(setup, split):
  want = _full_forward_logits(*setup)
  got = _decoded_logits(*setup, split=split)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # The rows of a group share a prompt, so they agree until their completions differ.
  np.testing.assert_allclose(got[0, 0], got[1, 0], rtol=1e-6, atol=1e-6)
  assert not np.allclose(got[0, -1], got[1, -1])


def test_a_cache_holds_each_prompt_once_and_whole_blocks_of_slots(setup):
  config, params, prompt_BP, mask_BP, _ = setup
  _, cache = decode.prefill(params, config, prompt_BP, mask_BP, num_samples=G, max_new_tokens=T,
                            block_size=BLOCK)
  Y, K, H = config.n_layers, config.n_kv_heads, config.head_dim
  assert cache.prompt_k_YBKPH.shape == (Y, 2, K, P, H)
  assert cache.k_YRKHT.shape == (Y, 2 * G, K, H, 6) and cache.v_YRKTH.shape == (Y, 2 * G, K, 6, H)
  assert int(cache.length) == 0


def test_layouts_must_match(setup):
  config, params, prompt_BP, mask_BP, _ = setup
  _, cache = decode.prefill(params, config, prompt_BP, mask_BP, num_samples=G, max_new_tokens=T)
  with pytest.raises(ValueError, match='split_layers'):
    decode.decode_step(decode.split_layers(params), config, jnp.zeros(4, jnp.int32),
                       jnp.zeros(4, jnp.int32), cache)


@pytest.mark.parametrize('split', [False, True])
def test_per_row_slots_started_at_different_steps_equal_full_forwards(setup, split):
  """A cache of 3 slots with their own lengths and prompts (`prefill(slots=3)`): slot 1 is
  restarted on another prompt after two steps (`start_rows`), so the slots hold 2, 5 and 5
  tokens of different prompts; each slot's logits equal one forward pass of its own sequence."""
  config, params, prompt_BP, mask_BP, completion_RT = setup
  _, cache = decode.prefill(params, config, prompt_BP, mask_BP, num_samples=G, max_new_tokens=T,
                            block_size=BLOCK, slots=3)
  assert cache.per_row and cache.length.shape == (3,) and cache.k_YRKHT.shape[1] == 3
  decode_params = params
  if split:
    decode_params, cache = decode.split_layers(params), decode.split_cache(cache)
  step = jax.jit(
      lambda p, tok, pos, cache: decode.decode_step(p, config, tok, pos, cache, block_size=BLOCK))
  lengths_B = jnp.sum(mask_BP, axis=1)
  prompt_R = jnp.array([1, 0, 1])
  cache = decode.start_rows(cache, jnp.ones(3, bool), prompt_R)
  fed = [[], [], []]  # the tokens each slot has fed since its start
  tokens_RT = completion_RT[:3]
  for t in range(5):
    if t == 2:
      prompt_R = prompt_R.at[1].set(1)
      cache = decode.start_rows(cache, jnp.array([False, True, False]), prompt_R)
      fed[1] = []
    token_R = jnp.array([tokens_RT[o, len(fed[o])] for o in range(3)])
    positions_R = lengths_B[prompt_R] + jnp.array([len(f) for f in fed])
    logits_RV, cache = step(decode_params, token_R, positions_R, cache)
    for o in range(3):
      fed[o].append(int(token_R[o]))
  np.testing.assert_array_equal(cache.length, [5, 3, 5])
  for o in range(3):
    b, n = int(prompt_R[o]), len(fed[o])
    tokens = jnp.concatenate([prompt_BP[b], jnp.asarray(fed[o], jnp.int32)])[None]
    mask = jnp.concatenate([mask_BP[b], jnp.ones(n, jnp.int32)])[None]
    want = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask),
                             mask).logits_BLV[0, -1]
    np.testing.assert_allclose(logits_RV[o], want, rtol=1e-4, atol=1e-4)


def test_start_rows_needs_a_per_row_cache(setup):
  config, params, prompt_BP, mask_BP, _ = setup
  _, cache = decode.prefill(params, config, prompt_BP, mask_BP, num_samples=G, max_new_tokens=T)
  with pytest.raises(ValueError, match='start_rows'):
    decode.start_rows(cache, jnp.ones(4, bool), jnp.zeros(4, jnp.int32))
