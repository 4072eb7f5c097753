"""A tiny Qwen3.5-style hybrid (Gated DeltaNet + gated full attention) through every path of the
model: the KV-cache forward, the sampler's prefill and decode steps (scanned and unrolled) and
the sampler's log-probs equal one scoring pass; the continuous scheduler draws what the static
one draws; LoRA adapts both kinds of layer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import decode
from jtc.models import logprobs
from jtc.models import lora
from jtc.models import model as model_lib
from jtc.models import sampler
from jtc.models.model_config import ModelConfig

L, F = 'linear_attention', 'full_attention'
G, P, T = 2, 5, 6
CONFIG = ModelConfig.tiny_hybrid(vocab_size=29, n_layers=4, d_model=16, n_heads=2, n_kv_heads=1,
                                 head_dim=8, d_ff=32, linear_n_k_heads=1, linear_n_v_heads=2,
                                 linear_k_head_dim=8, linear_v_head_dim=6, linear_chunk=4,
                                 layer_types=(L, F, L, F))


@pytest.fixture(scope='module')
def setup():
  params = model_lib.init_params(CONFIG, jax.random.key(0))
  prompt_BP = jnp.array([[0, 0, 7, 3, 11], [4, 9, 2, 8, 1]], jnp.int32)  # left-padded
  mask_BP = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)
  completion_RT = jax.random.randint(jax.random.key(1), (2 * G, T), 1, 29)
  return params, prompt_BP, mask_BP, completion_RT


def _sequences(prompt_BP, mask_BP, completion_RT):
  tokens_RL = jnp.concatenate([jnp.repeat(prompt_BP, G, axis=0), completion_RT], axis=1)
  mask_RL = jnp.concatenate([jnp.repeat(mask_BP, G, axis=0), jnp.ones_like(completion_RT)], axis=1)
  return tokens_RL, mask_RL


def test_kv_cache_forward_continues_the_sequence(setup):
  params, prompt_BP, mask_BP, completion_RT = setup
  tokens_RL, mask_RL = _sequences(prompt_BP, mask_BP, completion_RT)
  positions_RL = model_lib.positions_from_mask(mask_RL)
  full = model_lib.forward(params, CONFIG, tokens_RL, positions_RL, mask_RL).logits_BLV
  cache = model_lib.init_cache(CONFIG, 2 * G, P + T)
  assert cache.k.shape[0] == 2 and cache.linear.ssm_BNHH.shape[0] == 2
  got = []
  for lo, hi in ((0, 7), (7, P + T)):
    out = model_lib.forward(params, CONFIG, tokens_RL[:, lo:hi], positions_RL[:, lo:hi],
                            mask_RL[:, lo:hi], cache)
    cache = out.cache
    got.append(out.logits_BLV)
  real = np.asarray(mask_RL, bool)
  np.testing.assert_allclose(
      np.asarray(jnp.concatenate(got, 1))[real],
      np.asarray(full)[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('split', [False, True])
def test_prefill_and_decode_steps_equal_one_full_forward(setup, split):
  params, prompt_BP, mask_BP, completion_RT = setup
  tokens_RL, mask_RL = _sequences(prompt_BP, mask_BP, completion_RT)
  want = model_lib.forward(params, CONFIG, tokens_RL, model_lib.positions_from_mask(mask_RL),
                           mask_RL).logits_BLV[:, P - 1:-1]
  first_BV, cache = decode.prefill(params, CONFIG, prompt_BP, mask_BP, num_samples=G,
                                   max_new_tokens=T, block_size=4)
  # Each prompt's recurrent state, computed once, is in each of its G rows.
  ssm = np.asarray(cache.linear.ssm_BNHH)
  np.testing.assert_array_equal(ssm[:, 0], ssm[:, 1])
  assert not np.allclose(ssm[:, 0], ssm[:, 2])
  p = params
  if split:
    p, cache = decode.split_layers(params), decode.split_cache(cache)
  step = jax.jit(
      lambda p, tok, pos, cache: decode.decode_step(p, CONFIG, tok, pos, cache, block_size=4))
  positions_R = jnp.repeat(jnp.sum(mask_BP, axis=1), G)
  got = [jnp.repeat(first_BV, G, axis=0)]
  for t in range(T - 1):
    logits_RV, cache = step(p, completion_RT[:, t], positions_R + t, cache)
    got.append(logits_RV)
  np.testing.assert_allclose(jnp.stack(got, 1), want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope='module')
def sample(setup):
  """fn(**scheduler) -> `sampler.sample` of the two prompts (G = 2: R = 4 rows), temperature 1,
  and the static scheduler's sample."""
  params, prompt_BP, mask_BP, _ = setup
  run = lambda **more: sampler.sample(params, CONFIG, prompt_BP, mask_BP, rng=jax.random.key(
      3), num_samples=G, max_new_tokens=T, eos_id=1, pad_id=0, temperature=1.0, **more)
  return run, run(scheduler='static')


def test_sampler_logprobs_equal_the_scoring_pass(setup, sample):
  """The recurrent form (sampling) and the chunked form (scoring) give one token's log-prob to
  float32 round-off: the mismatch instruments' negative control reads zero."""
  params, *_ = setup
  out = sample[1]
  scored = logprobs.sequence_logprobs(params, CONFIG, out.tokens_RL, out.input_mask_RL,
                                      completion_start=P)
  mask = np.asarray(out.completion_mask_RT, bool)
  np.testing.assert_allclose(
      np.asarray(scored['logps'])[mask],
      np.asarray(out.logps_RT)[mask], rtol=1e-5, atol=1e-5)


# 3 slots (rows of both prompts at once, a slot refilled) in CI; 1 slot (every row but the first
# refills the slot) slow-only: each is a sampler compile of ~5 s of CPU.
@pytest.mark.parametrize('slots', [pytest.param(1, marks=pytest.mark.slow), 3])
def test_continuous_scheduler_draws_what_static_draws(sample, slots):
  """Decode slots that take new (prompt, sample) rows as rows end: a slot restarts its
  recurrent and convolution states from the new row's prompt-final ones (`decode.start_rows`),
  so each row's tokens are the static scheduler's (a slot that kept its previous row's states
  would change them: the test fails so with 3 slots, the fourth row refilling a slot)."""
  run, want = sample
  assert len(set(np.asarray(want.completion_mask_RT).sum(1).tolist())) >= 2  # rows end apart
  got = run(scheduler='continuous', slots=slots)
  for name in ('tokens_RL', 'completion_mask_RT', 'truncated_R'):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  np.testing.assert_allclose(got.logps_RT, want.logps_RT, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # LoRA on a hybrid; LoRA on the dense model is in CI (test_lora.py)
def test_lora_adapts_both_kinds_of_layer(setup):
  params, prompt_BP, mask_BP, completion_RT = setup
  adapters = lora.init_adapters(CONFIG, rank=2, targets=('q', 'v', 'o', 'up'))
  assert adapters['layers']['linear_attn']['q']['lora_a'].shape == (2, 16, 2)
  assert adapters['layers']['attn']['q']['lora_b'].shape == (2, 2, 2, 8)
  adapters = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(5), x.shape),
                          adapters)
  tokens_RL, mask_RL = _sequences(prompt_BP, mask_BP, completion_RT)
  forward = lambda p: model_lib.forward(p, CONFIG, tokens_RL, model_lib.positions_from_mask(
      mask_RL), mask_RL).logits_BLV
  adapted = forward(lora.Adapted(params, adapters, scale=2.0))
  merged = forward(lora.merge(params, adapters, 2.0))
  np.testing.assert_allclose(adapted, merged, rtol=1e-4, atol=1e-4)
  assert np.max(np.abs(merged - forward(params))) > 1e-2
