"""The stacked-layer, shared-prompt sampler draws what the sampler before it drew.

`tests/models/reference_sampler.py` is a frozen copy of the earlier sampler (prompt cache repeated G
times, the whole [P + T] cache read every step, per-layer parameters). For the same key both
must give the same tokens, masks and truncation flags and log-probs equal within float
rounding: greedy and sampled, with EOS inside the window and rows that run out of it, left
padding (prompts of different lengths), G = 1 and G > 1, several completion-block sizes, the
scanned and the unrolled layer loop.

The reference draws token t of every row from one key, fold_in(rng, t), with
`jax.random.categorical` over all rows at once; today's sampler draws row r's token t with
fold_in(fold_in(rng, t), r), so that a row's draws do not depend on which rows decode beside it
(`jtc.models.decode_loop`). The reference runs here with that one line of today's convention:
`jax.random.categorical` folds each row's index into the step key it is given.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models import model_reference
from tests.models import reference_sampler
from jtc.models import decode
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib

PAD = 0
PROMPTS = [[5, 9, 14, 2], [7], [3, 11, 6, 8, 20, 4], [12, 12]]
CONFIGS = {
    'qwen3_like':
        model_lib.ModelConfig.tiny(vocab_size=23, n_layers=3, d_model=32, n_heads=4, n_kv_heads=2,
                                   head_dim=8, d_ff=48, qk_norm=True),
    'llama_like_mha':
        model_lib.ModelConfig.tiny(vocab_size=23, n_layers=2, d_model=32, n_heads=2, n_kv_heads=2,
                                   head_dim=16, d_ff=48, tie_embeddings=False, attn_bias=True),
}


@pytest.fixture(autouse=True)
def row_keyed_draws(monkeypatch):
  """`jax.random.categorical(key, logits_RV)` -> row r drawn with fold_in(key, r) (see above)."""
  categorical = jax.random.categorical

  def per_row(key, logits_RV, axis=-1):
    assert axis == -1 and logits_RV.ndim == 2
    rows_R = jnp.arange(logits_RV.shape[0])
    return jax.vmap(lambda r, x: categorical(jax.random.fold_in(key, r), x))(rows_R, logits_RV)

  monkeypatch.setattr(jax.random, 'categorical', per_row)


def _params(config, seed):
  params = model_lib.init_params(config, jax.random.key(seed))
  # A sharper output distribution than N(0, 1/D) gives (otherwise every token is near 1/V).
  params['embed']['embedding'] = 3.0 * params['embed']['embedding']
  return params


CASES = {  # name -> (config, G, T, block_size, layer loop, sampling kwargs)
    'greedy_G1_blocks_of_4_scan': ('qwen3_like', 1, 11, 4, 'scan', dict(greedy=True)),
    'sampled_G3_blocks_of_4_unroll': ('qwen3_like', 3, 11, 4, 'unroll', dict(temperature=1.0)),
    'filtered_G2_one_block_scan': ('llama_like_mha', 2, 9, 128, 'scan',
                                   dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.02)),
    'sampled_G2_default_block_and_loop': ('qwen3_like', 2, 11, None, 'auto',
                                          dict(temperature=1.0)),
}


def _eos_some_rows_emit(completion_RT):
  """A token that some rows of a run emit after their first two tokens and others never do
  (as EOS it ends those rows early and leaves the rest truncated)."""
  rows_with_V = np.array([(completion_RT[:, 2:] == v).any(1).sum() for v in range(23)])
  rows_with_V[PAD] = 0
  rows_with_V[rows_with_V == completion_RT.shape[0]] = 0
  return int(np.argmax(rows_with_V))


# Two of the four cases in CI (a sampled and a filtered one); the others in the slow set.
@pytest.mark.parametrize('case', [
    c if c in ('filtered_G2_one_block_scan',
               'sampled_G2_default_block_and_loop') else pytest.param(c, marks=pytest.mark.slow)
    for c in sorted(CASES)
])
def test_same_samples_as_the_reference_sampler(case):
  name, G, T, block_size, layer_loop, kwargs = CASES[case]
  config = CONFIGS[name]
  params = _params(config, seed=len(case))
  tokens, mask = model_reference.padded_batch(PROMPTS, 7, PAD)
  kw = dict(rng=jax.random.key(5), num_samples=G, max_new_tokens=T, pad_id=PAD, **kwargs)
  probe = reference_sampler.sample(model_lib.unstack_layers(params), config, tokens, mask,
                                   eos_id=PAD, **kw)
  eos = _eos_some_rows_emit(np.asarray(probe.completion))
  want = reference_sampler.sample(model_lib.unstack_layers(params), config, tokens, mask,
                                  eos_id=eos, **kw)
  got = sampler_lib.sample(params, config, tokens, mask, eos_id=eos, block_size=block_size,
                           layer_loop=layer_loop, **kw)
  R = len(PROMPTS) * G
  truncated = np.asarray(want.truncated)
  assert got.tokens_RL.shape == (R, 7 + T)
  assert 0 < truncated.sum() < R, truncated  # both ways of ending a row are exercised
  np.testing.assert_array_equal(got.tokens_RL, want.tokens)
  np.testing.assert_array_equal(got.input_mask_RL, want.input_mask)
  np.testing.assert_array_equal(got.completion_mask_RT, want.completion_mask)
  np.testing.assert_array_equal(got.truncated_R, want.truncated)
  np.testing.assert_allclose(got.logps_RT, want.logps, rtol=1e-5, atol=1e-5)


def test_group_cache_holds_each_prompt_once_and_decode_matches_full_forward():
  """The prompt block is [Y, B, K, P, H] (not repeated G times); one decode step of the G
  rows of each group equals the full causal forward over [prompt | completion so far]."""
  config = CONFIGS['qwen3_like']
  params = _params(config, seed=0)
  G, P, n_prev = 3, 7, 5
  tokens_BP, mask_BP = model_reference.padded_batch(PROMPTS, P, PAD)
  B = tokens_BP.shape[0]
  _, cache = decode.prefill(params, config, tokens_BP, mask_BP, num_samples=G, max_new_tokens=5,
                            block_size=2)
  Y, K, H = config.n_layers, config.n_kv_heads, config.head_dim
  assert cache.prompt_k_YBKPH.shape == (Y, B, K, P, H)
  assert cache.k_YRKHT.shape == (Y, B * G, K, H, 6) and cache.v_YRKTH.shape == (Y, B * G, K, 6, H)
  completion_RT = jax.random.randint(jax.random.key(1), (B * G, n_prev), 1, 23)
  positions_R = jnp.repeat(jnp.sum(mask_BP, 1), G)
  step = jax.jit(lambda p, t, pos, c: decode.decode_step(p, config, t, pos, c, block_size=2))
  for t in range(n_prev):
    logits_RV, cache = step(params, completion_RT[:, t], positions_R + t, cache)
  full_tokens = jnp.concatenate([jnp.repeat(tokens_BP, G, 0), completion_RT], 1)
  full_mask = jnp.concatenate([jnp.repeat(mask_BP, G, 0), jnp.ones_like(completion_RT)], 1)
  full = model_lib.forward(params, config, full_tokens, model_lib.positions_from_mask(full_mask),
                           full_mask).logits_BLV[:, -1]
  assert int(cache.length) == n_prev
  np.testing.assert_allclose(logits_RV, full, rtol=2e-5, atol=2e-5)
