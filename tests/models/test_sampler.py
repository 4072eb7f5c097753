"""Tests for jtc.models.sampler: greedy vs full recompute, filters, EOS/masks, determinism, traces."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib

CONFIG = model_lib.ModelConfig.tiny(vocab_size=23, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                    head_dim=8, d_ff=48, qk_norm=True)
PAD, EOS = 0, 1
PROMPTS = [[5, 9, 14, 2], [7], [3, 11, 6, 8, 20, 4]]


@pytest.fixture(scope='module')
def params():
  """Random weights (numpy-filled from eval_shape: nothing to compile)."""
  shapes = jax.eval_shape(
      lambda: model_lib.unstack_layers(model_lib.init_params(CONFIG, jax.random.key(0))))
  rng = np.random.default_rng(0)

  def fill(path, leaf):
    if path[-1].key == 'scale':
      return jnp.ones(leaf.shape)
    # Embedding std 2/sqrt(D): sharpens the tied output distribution (not uniform noise).
    std = 2.0 / np.sqrt(leaf.shape[-1]) if path[-1].key == 'embedding' else 1 / np.sqrt(
        leaf.shape[0] if path[-2].key != 'o' else np.prod(leaf.shape[:-1]))
    return jnp.asarray(std * rng.standard_normal(leaf.shape), jnp.float32)

  return model_lib.stack_layers(jax.tree_util.tree_map_with_path(fill, shapes))


def left_pad(rows, width):
  tokens = np.full((len(rows), width), PAD, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    tokens[b, width - len(row):] = row
    mask[b, width - len(row):] = 1
  return jnp.asarray(tokens), jnp.asarray(mask)


_full_logits = jax.jit(lambda params, tokens, mask: model_lib.forward(
    params, CONFIG, tokens, model_lib.positions_from_mask(mask), mask).logits_BLV)


def teacher_forced_logits(params, out, P):
  """Logits [R, T, V] that predicted each completion token, recomputed without a cache."""
  return _full_logits(params, out.tokens_RL, out.input_mask_RL)[:, P - 1:-1]


def check_mask_structure(out, P, G):
  comp, mask = np.asarray(out.completion_RT), np.asarray(out.completion_mask_RT)
  for r in range(comp.shape[0]):
    eos_at = np.flatnonzero(comp[r] == EOS)
    n = eos_at[0] + 1 if len(eos_at) else comp.shape[1]
    np.testing.assert_array_equal(mask[r], np.arange(comp.shape[1]) < n)
    assert (comp[r, n:] == PAD).all()
    assert bool(out.truncated_R[r]) == (len(eos_at) == 0)
  assert (np.asarray(out.logps_RT)[mask == 0] == 0).all()
  np.testing.assert_array_equal(out.tokens_RL[:, P:], comp)
  np.testing.assert_array_equal(out.input_mask_RL[:, P:], mask)
  prompts = np.asarray(out.tokens_RL[:, :P]).reshape(-1, G, P)
  assert (prompts == prompts[:, :1]).all()  # rows b*G .. b*G+G-1 share prompt b


def test_greedy_matches_argmax_of_full_recompute(params):
  P, T = 7, 6
  tokens, mask = left_pad(PROMPTS, P)
  out = sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(0), num_samples=2,
                           max_new_tokens=T, eos_id=EOS, pad_id=PAD, greedy=True)
  W = max(map(len, PROMPTS)) + T  # one fixed width: right padding never affects the past
  for b, prompt in enumerate(PROMPTS):
    seq, want, want_logps = list(prompt), [], []
    for _ in range(T):
      ids = jnp.asarray([seq + [PAD] * (W - len(seq))])
      ids_mask = (jnp.arange(W) < len(seq)).astype(jnp.int32)[None]
      logits = np.asarray(_full_logits(params, ids, ids_mask)[0, len(seq) - 1], np.float64)
      tok = int(np.argmax(logits))
      want.append(tok)
      want_logps.append(logits[tok] - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max())
      seq.append(tok)
      if tok == EOS:
        break
    for g in range(2):
      r = 2 * b + g
      n = len(want)
      np.testing.assert_array_equal(out.completion_RT[r, :n], want)
      np.testing.assert_allclose(out.logps_RT[r, :n], want_logps, rtol=1e-5, atol=1e-5)
  check_mask_structure(out, P, 2)


@pytest.mark.parametrize(
    'kwargs',
    [dict(temperature=0.7, top_k=3),
     dict(temperature=1.3, top_k=6, top_p=0.7, min_p=0.1)])
def test_samples_inside_filtered_set_and_logps_consistent(params, kwargs):
  """Each chosen token is allowed by the filters applied to the teacher-forced logits, and
  the returned log-prob equals log_softmax of those filtered logits."""
  P, T, G = 6, 5, 8
  tokens, mask = left_pad(PROMPTS, P)
  out = sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(1), num_samples=G,
                           max_new_tokens=T, eos_id=EOS, pad_id=PAD, **kwargs)
  check_mask_structure(out, P, G)
  filtered = sampler_lib.sampling_logits(
      teacher_forced_logits(params, out, P), **{
          **dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
          **kwargs
      })
  logp = np.asarray(jax.nn.log_softmax(filtered, axis=-1))
  chosen = np.take_along_axis(logp, np.asarray(out.completion_RT)[..., None], axis=-1)[..., 0]
  real = np.asarray(out.completion_mask_RT, bool)
  assert np.isfinite(chosen[real]).all()  # never a filtered-out token
  np.testing.assert_allclose(np.asarray(out.logps_RT)[real], chosen[real], rtol=1e-4, atol=1e-4)


def test_filters_keep_exactly_the_specified_sets():
  probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
  perm = np.array([3, 0, 5, 1, 4, 2])
  logits = jnp.log(jnp.asarray(probs[perm]))[None]
  kept = lambda f: set(perm[np.flatnonzero(np.isfinite(np.asarray(f)[0]))])
  assert kept(sampler_lib.apply_top_k(logits, 2)) == {0, 1}
  assert kept(sampler_lib.apply_top_p(logits, 0.39)) == {0}
  assert kept(sampler_lib.apply_top_p(logits, 0.41)) == {0, 1}
  assert kept(sampler_lib.apply_top_p(logits, 0.79)) == {0, 1, 2}
  assert kept(sampler_lib.apply_top_p(logits, 1.0)) == set(range(6))
  assert kept(sampler_lib.apply_min_p(logits, 0.3)) == {0, 1, 2}  # p >= 0.12
  assert kept(sampler_lib.apply_min_p(logits, 0.5)) == {0, 1}  # p >= 0.2


def test_first_argmax_and_choose_match_jax_argmax_categorical_and_log_softmax():
  """The sampler's token choice is jnp.argmax / jax.random.categorical of each row with its own
  key exactly (ties, -inf from the filters, a NaN), and its log-prob is log_softmax of the logits
  the token was drawn from."""
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 3, (64, 37)).astype(np.float32)  # many ties
  x[0, :] = -np.inf
  x[0, 5] = 0.0
  x[1, 7], x[1, 9] = np.nan, np.nan
  np.testing.assert_array_equal(sampler_lib.first_argmax(jnp.asarray(x)), jnp.argmax(x, axis=-1))
  logits = jnp.asarray(3 * rng.standard_normal((64, 37)), jnp.float32)
  for kw in (dict(greedy=True), dict(top_k=5), dict(top_p=0.7, temperature=0.8)):
    kw = dict(dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False), **kw)
    for seed in range(3):
      keys = jax.random.split(jax.random.key(seed), 64)
      token, logp = sampler_lib._choose(logits, keys, **kw)  # pylint: disable=protected-access
      if kw['greedy']:
        want, ref = jnp.argmax(logits, axis=-1), logits
      else:
        ref = sampler_lib.sampling_logits(logits, temperature=kw['temperature'], top_k=kw['top_k'],
                                          top_p=kw['top_p'], min_p=kw['min_p'])
        want = jax.vmap(jax.random.categorical)(keys, ref)
      np.testing.assert_array_equal(token, want)
      np.testing.assert_allclose(logp,
                                 jax.nn.log_softmax(ref)[np.arange(64), want], rtol=1e-6, atol=1e-6)


def test_eos_stops_rows_and_finished_batches(params):
  """With EOS = the greedy first token of every row, each row stops after one token."""
  P = 6
  tokens, mask = left_pad(PROMPTS, P)
  first = sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(0), num_samples=1,
                             max_new_tokens=1, eos_id=EOS, pad_id=PAD, greedy=True)
  eos = int(first.completion_RT[0, 0])
  out = sampler_lib.sample(params, CONFIG, tokens[:1], mask[:1], rng=jax.random.key(0),
                           num_samples=3, max_new_tokens=5, eos_id=eos, pad_id=PAD, greedy=True)
  np.testing.assert_array_equal(out.completion_mask_RT, [[1, 0, 0, 0, 0]] * 3)
  np.testing.assert_array_equal(out.completion_RT[:, 1:], PAD)
  assert not np.asarray(out.truncated_R).any()


def test_deterministic_per_key_and_varies_across_keys(params):
  tokens, mask = left_pad(PROMPTS, 6)
  run = lambda seed: sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(seed),
                                        num_samples=4, max_new_tokens=6, eos_id=EOS, pad_id=PAD)
  a, b, c = run(7), run(7), run(8)
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
  assert not np.array_equal(a.completion_RT, c.completion_RT)
  # Samples within a group differ (one shared prefill, independent draws).
  assert len({tuple(r) for r in np.asarray(a.completion_RT[:4])}) > 1


def test_left_padding_invariance_of_samples(params):
  """The same prompts padded to widths 6 and 9 give the same samples for the same key."""
  outs = []
  for width in (6, 9):
    tokens, mask = left_pad(PROMPTS, width)
    outs.append(
        sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(3), num_samples=4,
                           max_new_tokens=6, eos_id=EOS, pad_id=PAD))
  np.testing.assert_array_equal(outs[0].completion_RT, outs[1].completion_RT)
  np.testing.assert_array_equal(outs[0].completion_mask_RT, outs[1].completion_mask_RT)
  np.testing.assert_allclose(outs[0].logps_RT, outs[1].logps_RT, rtol=1e-5, atol=1e-5)


def test_compiled_once_per_bucket(params, monkeypatch):
  counted = chex.assert_max_traces(sampler_lib._sample_impl, n=1)
  monkeypatch.setattr(sampler_lib, '_sample_jit',
                      jax.jit(counted, static_argnames=sampler_lib._STATIC))
  kwargs = dict(num_samples=2, max_new_tokens=4, eos_id=EOS, pad_id=PAD, top_k=4)
  for seed, rows in enumerate([PROMPTS, [[1, 2], [3, 4, 5], [6]], [[9], [9], [9, 9, 9, 9]]]):
    tokens, mask = left_pad(rows, 6)
    sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(seed), **kwargs)
  tokens, mask = left_pad(PROMPTS, 6)
  with pytest.raises(AssertionError):  # a new bucket (different P) is a new trace
    tokens, mask = left_pad(PROMPTS, 7)
    sampler_lib.sample(params, CONFIG, tokens, mask, rng=jax.random.key(0), **kwargs)


@pytest.mark.parametrize('name,value', [('num_samples', 0), ('max_new_tokens', 0), ('eos_id', 23),
                                        ('pad_id', -1), ('temperature', 0.0), ('top_k', 24),
                                        ('top_p', 0.0), ('min_p', 1.5), ('block_size', 0),
                                        ('layer_loop', 'fused'), ('eos_id', [1, 99])])
def test_bad_arguments_raise(params, name, value):
  tokens, mask = left_pad(PROMPTS, 6)
  kwargs = dict(rng=jax.random.key(0), num_samples=1, max_new_tokens=2, eos_id=EOS, pad_id=PAD)
  kwargs[name] = value
  with pytest.raises(ValueError, match=name):
    sampler_lib.sample(params, CONFIG, tokens, mask, **kwargs)


def test_several_eos_ids_each_end_a_row(params):
  """eos_id may list several ids (a tokenizer's `eos_ids`): a row ends at the first of any."""
  tokens, mask = left_pad(PROMPTS, 6)
  kw = dict(rng=jax.random.key(0), num_samples=1, max_new_tokens=6, pad_id=PAD, greedy=True)
  free = np.asarray(
      sampler_lib.sample(params, CONFIG, tokens, mask, eos_id=EOS, **kw).completion_RT)
  eos_ids = sorted({int(free[0, 2]), int(free[1, 3])})
  out = sampler_lib.sample(params, CONFIG, tokens, mask, eos_id=eos_ids, **kw)
  comp, got_mask = np.asarray(out.completion_RT), np.asarray(out.completion_mask_RT)
  for r in range(comp.shape[0]):
    hits = np.flatnonzero(np.isin(free[r], eos_ids))
    n = hits[0] + 1 if len(hits) else comp.shape[1]
    np.testing.assert_array_equal(got_mask[r], np.arange(comp.shape[1]) < n)
    np.testing.assert_array_equal(comp[r, :n], free[r, :n])
    assert bool(out.truncated_R[r]) == (len(hits) == 0)
  assert not out.truncated_R[0] and not out.truncated_R[1]


@pytest.mark.parametrize('layer_loop', ['scan', pytest.param('unroll', marks=pytest.mark.slow)])
def test_routed_experts_are_those_of_a_full_forward_pass(layer_loop):
  """A mixture-of-experts policy: the same samples with and without `return_routing`, and the
  experts the sampler reports for every fed token (prompt in the prefill, completion in its
  decode step) are those the full forward pass over the sampled rows routes it to; -1 on pads and
  tokens after EOS, and on a row's last token when decoding stopped before feeding it."""
  config = model_lib.ModelConfig.tiny_moe(vocab_size=23, n_layers=2, d_model=32, n_heads=4,
                                          n_kv_heads=2, head_dim=8, n_experts=4, d_expert=16)
  params = model_lib.init_params(config, jax.random.key(3))
  tokens_BP, mask_BP = left_pad(PROMPTS, 6)
  kw = dict(rng=jax.random.key(0), num_samples=2, max_new_tokens=7, eos_id=EOS, pad_id=PAD,
            layer_loop=layer_loop)
  out = sampler_lib.sample(params, config, tokens_BP, mask_BP, return_routing=True, **kw)
  plain = sampler_lib.sample(params, config, tokens_BP, mask_BP, **kw)
  np.testing.assert_array_equal(out.tokens_RL, plain.tokens_RL)
  assert plain.experts_RLYW is None and out.experts_RLYW.shape == (6, 13, 2, 2)
  routed = model_lib.forward(params, config, out.tokens_RL,
                             model_lib.positions_from_mask(out.input_mask_RL),
                             out.input_mask_RL).routed
  full_RLYW = np.asarray(routed.experts_BLW).transpose(1, 2, 0, 3)
  real_RL = np.asarray(out.input_mask_RL) > 0
  got = np.asarray(out.experts_RLYW)
  assert (got[~real_RL] == -1).all()
  fed_RL = real_RL & (got[..., 0, 0] >= 0)
  np.testing.assert_array_equal(got[fed_RL], full_RLYW[fed_RL])
  last_R = 6 + np.asarray(out.completion_mask_RT).sum(-1) - 1
  unfed_R, unfed_L = np.nonzero(real_RL & ~fed_RL)
  np.testing.assert_array_equal(unfed_L, last_R[unfed_R])  # only a row's last token
  assert not out.truncated_R.all() or len(unfed_R) == 6  # (then every row's)
  with pytest.raises(ValueError, match='return_routing'):
    sampler_lib.sample(params, CONFIG, tokens_BP, mask_BP, return_routing=True, **kw)
