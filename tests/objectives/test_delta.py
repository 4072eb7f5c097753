"""Tests for jtc.objectives.delta (DelTA token coefficients, arXiv 2605.21467)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.objectives import delta
from jtc.objectives import delta_geometry
from jtc.objectives import token_weights

B, T, D = 6, 5, 4

# ------------------------------------------------------------------ helpers


def split_options(opts):
  """kwargs -> (DeltaOptions, the call's own keyword arguments)."""
  opts = dict(opts)
  call = {k: opts.pop(k) for k in ('group_size', 'rng', 'unembed_VD', 'token_ids_BT') if k in opts}
  return delta.DeltaOptions(**opts), call


@functools.lru_cache(maxsize=None)
def _jitted(opts: tuple):
  """One compiled estimator per option set (options are static)."""
  options, call = split_options(opts)
  return jax.jit(
      lambda h, lp, a, m, rng: delta.token_coefficients(h, lp, a, m, options, rng=rng, **call))


def logp(p):
  """log p in float32 (p = 0 gives -inf, whose proxy weight 1 - p is 1)."""
  with np.errstate(divide='ignore'):
    return jnp.asarray(np.log(np.asarray(p, np.float64)), jnp.float32)


def inputs(h, p, a, m):
  """float32 (hidden, log p, advantages, mask) for `token_coefficients` from p."""
  return (jnp.asarray(h,
                      jnp.float32), logp(p), jnp.asarray(a,
                                                         jnp.float32), jnp.asarray(m, jnp.float32))


def run(h, p, a, m, rng=None, **opts):
  """`token_coefficients` on probabilities p of the sampled tokens (the tests' reference
    `ref_delta` takes p too)."""
  if rng is None:
    rng = jax.random.PRNGKey(0)
  opts.setdefault('chunk_size', 7)  # several chunks, shared compile cache
  lam, met = _jitted(tuple(sorted(opts.items())))(*inputs(h, p, a, m), rng)
  return np.asarray(lam, np.float64), {k: float(v) for k, v in met.items()}


def random_batch(seed, b=B, t=T, d=D):
  r = np.random.default_rng(seed)
  h = r.normal(size=(b, t, d))
  p = r.uniform(0.0, 0.95, size=(b, t))
  a = np.array([1.0, -0.5, 2.0, -1.5, 0.0, 0.7, -0.3, 1.2][:b] + [0.4] * max(0, b - 8))
  m = (r.uniform(size=(b, t)) > 0.15).astype(np.float64)
  m[:, 0] = 1.0
  return h, p, a, m


def ref_delta(h, p, a, m, *, group_size=None, scope='batch', lam_min=0.8, lam_max=1.2, num_refine=1,
              gamma=None, soft_assignment=True, normalize=True, range_map=True,
              within_side_only=False):
  """Plain-loop float64 reference of the DelTA estimator (explicit differences)."""
  b_, t_, _ = h.shape
  if scope == 'group':
    segments = [list(range(s, s + group_size)) for s in range(0, b_, group_size)]
  else:
    segments = [list(range(b_))]
  lam = np.zeros((b_, t_))
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
  for rows in segments:
    toks = [(i, t) for i in rows for t in range(t_) if m[i, t] > 0]
    pos = [(i, t) for (i, t) in toks if a[i] > 0]
    neg = [(i, t) for (i, t) in toks if a[i] < 0]
    for tok in toks:
      lam[tok] = 1.0
    if pos and neg:
      v = {tok: (1.0 - p[tok]) * h[tok] for tok in pos + neg}

      def centroid(side, alpha, prev=None):
        num = sum(abs(a[i]) * alpha[(i, t)] * v[(i, t)] for (i, t) in side)
        den = sum(abs(a[i]) * alpha[(i, t)] for (i, t) in side)
        return prev if den == 0 else num / den

      alpha = {tok: 1.0 for tok in pos + neg}
      mu = {'pos': centroid(pos, alpha), 'neg': centroid(neg, alpha)}
      for k in range(num_refine + 1):
        for side, own, opp in ((pos, 'pos', 'neg'), (neg, 'neg', 'pos')):
          marg = {}
          for tok in side:
            d_own = np.sum((v[tok] - mu[own])**2)
            d_opp = np.sum((v[tok] - mu[opp])**2)
            marg[tok] = d_own if within_side_only else d_opp - d_own
          if within_side_only:
            avg = np.mean(list(marg.values()))
            marg = {tok: avg - d for tok, d in marg.items()}
          if gamma is None:
            g = max(np.std(list(marg.values())), 1e-12)
          else:  # fixed, in units of E||v||^2 over the scored tokens
            g = gamma * np.mean([np.sum(v[x]**2) for x in pos + neg])
          for tok in side:
            alpha[tok] = sigmoid(marg[tok] / g) if soft_assignment else float(marg[tok] > 0)
        if k < num_refine:
          mu = {'pos': centroid(pos, alpha, mu['pos']), 'neg': centroid(neg, alpha, mu['neg'])}
      for tok in pos + neg:
        lam[tok] = lam_min + (lam_max - lam_min) * alpha[tok] if range_map else alpha[tok]
    if normalize:
      z = sum(lam[tok] for tok in toks)
      lam[rows] *= len(toks) / z
  return lam


def lm_logp(w_VD, h_D, y):
  """Tiny LM head: logits = W h, log-softmax, log p(y)."""
  return jax.nn.log_softmax(w_VD @ h_D)[y]


# ------------------------------------------------------------------ proxies


def test_lm_head_proxy_identity():
  """grad_{W_y} log p(y) = (1 - p(y)) h  (DelTA Implementation)."""
  r = np.random.default_rng(0)
  w = jnp.asarray(r.normal(size=(7, D)), jnp.float32)
  hs = jnp.asarray(r.normal(size=(3, D)), jnp.float32)
  ys = [2, 5, 2]
  for h_D, y in zip(hs, ys):
    grad_VD = jax.grad(lm_logp)(w, h_D, y)
    np.testing.assert_allclose(grad_VD[y], delta_geometry.lm_head_proxy(h_D, lm_logp(w, h_D, y)),
                               rtol=1e-5, atol=1e-6)


def test_lm_head_proxy_keeps_its_precision_when_the_model_is_sure():
  """(1 - p) h at log p from -1e-2 to -1e-9 against float64; 1 - exp(log p) in float32 (the
    earlier form) is the failing control: wrong by ~5% at -1e-6 and exactly 0 at -1e-8."""
  logps = np.array([-1e-2, -1e-4, -1e-5, -1e-6, -1e-8, -1e-9])
  h_CD = np.ones((len(logps), D))
  want = -np.expm1(logps)[:, None] * h_CD
  got = np.asarray(
      delta_geometry.lm_head_proxy(jnp.asarray(h_CD, jnp.float32), jnp.asarray(logps, jnp.float32)))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  cancelling = 1.0 - np.exp(logps.astype(np.float32))
  assert np.abs(cancelling[3] / -np.expm1(logps[3]) - 1) > 1e-2 and cancelling[4] == 0.0


def test_topk_hidden_proxy_full_vocab_is_hidden_gradient():
  r = np.random.default_rng(1)
  v_, k_ = 7, 7
  w = jnp.asarray(r.normal(size=(v_, D)), jnp.float32)
  h_CD = jnp.asarray(r.normal(size=(3, D)), jnp.float32)
  ids = jnp.array([2, 5, 0])
  got = delta_geometry.topk_hidden_proxy(h_CD, ids, w, topk=k_)
  want = jnp.stack([jax.grad(lm_logp, argnums=1)(w, h_CD[c], ids[c]) for c in range(3)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Truncating to the top-1 token keeps only the most likely row of the expectation.
  probs = jax.nn.softmax(h_CD @ w.T, axis=-1)
  top1 = jnp.argmax(probs, axis=-1)
  want1 = w[ids] - jnp.max(probs, axis=-1)[:, None] * w[top1]
  np.testing.assert_allclose(delta_geometry.topk_hidden_proxy(h_CD, ids, w, topk=1), want1,
                             rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ reference

REF_CASES = [
    {},
    {
        'num_refine': 0
    },
    {
        'num_refine': 2
    },
    {
        'soft_assignment': False
    },
    {
        'normalize': False
    },
    {
        'range_map': False,
        'normalize': False
    },
    {
        'within_side_only': True
    },
    {
        'lam_min': 0.5,
        'lam_max': 1.5,
        'num_refine': 3,
        'gamma': 0.7
    },
    {
        'scope': 'group',
        'group_size': 2
    },
    {
        'scope': 'group',
        'group_size': 3,
        'within_side_only': True,
        'num_refine': 2
    },
]


@pytest.mark.parametrize('opts', REF_CASES,
                         ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()) or 'full')
@pytest.mark.parametrize('seed', [0, 1])
def test_matches_numpy_reference(opts, seed):
  h, p, a, m = random_batch(seed)
  lam, met = run(h, p, a, m, **opts)
  want = ref_delta(h, p, a, m, **opts)
  if opts.get('soft_assignment', True):
    np.testing.assert_allclose(lam, want, rtol=2e-5, atol=2e-5)
  else:
    # Hard assignment: a margin within float error of 0 could flip; allow none here.
    np.testing.assert_allclose(lam, want, rtol=1e-5, atol=1e-5)
  assert all(np.isfinite(v) for v in met.values())


def test_reference_with_one_sided_group():
  h, p, a, m = random_batch(3)
  a = np.array([1.0, 0.5, -1.0, 2.0, 0.0, 0.3])  # group 0 all >= 0; 1 and 2 mixed/zero
  lam, met = run(h, p, a, m, scope='group', group_size=2)
  np.testing.assert_allclose(lam, ref_delta(h, p, a, m, scope='group', group_size=2), rtol=2e-5,
                             atol=2e-5)
  np.testing.assert_allclose(lam[:2][m[:2] > 0], 1.0)


# ------------------------------------------------------------------ invariances


@pytest.mark.parametrize('scope', ['batch', 'group'])
def test_chunk_size_does_not_change_lambda(scope):
  h, p, a, m = random_batch(4)
  opts = {'scope': scope, 'group_size': 3 if scope == 'group' else None, 'num_refine': 2}
  results = [run(h, p, a, m, chunk_size=c, **opts)[0] for c in (7, 1, 1000)]
  for lam in results[1:]:
    np.testing.assert_allclose(lam, results[0], rtol=1e-5, atol=1e-6)


def test_bfloat16_hidden_matches_float32_of_same_values():
  h, p, a, m = random_batch(5)
  h16 = jnp.asarray(h, jnp.bfloat16)
  lam16, _ = jax.jit(delta.token_coefficients)(h16, logp(p), jnp.asarray(a, jnp.float32),
                                               jnp.asarray(m))
  lam32, _ = run(np.asarray(h16.astype(jnp.float32)), p, a, m)
  np.testing.assert_allclose(np.asarray(lam16), lam32, rtol=1e-5, atol=1e-6)


def test_permuting_trajectories_permutes_lambda():
  h, p, a, m = random_batch(6)
  perm = np.array([3, 0, 5, 1, 4, 2])
  lam, _ = run(h, p, a, m)
  lam_p, _ = run(h[perm], p[perm], a[perm], m[perm])
  np.testing.assert_allclose(lam_p, lam[perm], rtol=1e-5, atol=1e-6)
  # Group scope: permute whole groups and trajectories inside a group.
  gperm = np.array([4, 5, 1, 0, 2, 3])
  lam_g, _ = run(h, p, a, m, scope='group', group_size=2)
  lam_gp, _ = run(h[gperm], p[gperm], a[gperm], m[gperm], scope='group', group_size=2)
  np.testing.assert_allclose(lam_gp, lam_g[gperm], rtol=1e-5, atol=1e-6)


def test_masked_tokens_are_ignored():
  h, p, a, m = random_batch(7)
  lam, _ = run(h, p, a, m)
  h2, p2 = h.copy(), p.copy()
  h2[m == 0] = 1e3
  p2[m == 0] = 0.0
  lam2, _ = run(h2, p2, a, m)
  np.testing.assert_allclose(lam2, lam, rtol=1e-6, atol=1e-6)
  assert np.all(lam[m == 0] == 0.0)


def test_range_and_self_normalisation():
  h, p, a, m = random_batch(8)
  raw, _ = run(h, p, a, m, normalize=False)
  scored = (m > 0) & (a[:, None] != 0)
  assert np.all((raw[scored] >= 0.8 - 1e-6) & (raw[scored] <= 1.2 + 1e-6))
  assert np.all(raw[(m > 0) & ~scored] == 1.0)
  lam, met = run(h, p, a, m)
  np.testing.assert_allclose(lam[m > 0].mean(), 1.0, rtol=1e-6)
  factor = (m > 0).sum() / raw[m > 0].sum()
  np.testing.assert_allclose(lam, raw * factor, rtol=1e-5)
  np.testing.assert_allclose(met['norm_factor'], factor, rtol=1e-5)
  # Group scope: mean 1 inside every group.
  lam_g, _ = run(h, p, a, m, scope='group', group_size=3)
  for g in range(2):
    rows = slice(3 * g, 3 * g + 3)
    np.testing.assert_allclose(lam_g[rows][m[rows] > 0].mean(), 1.0, rtol=1e-6)


def test_gamma_adaptive_and_fixed_are_both_scale_invariant_and_differ():
  """Adaptive gamma is the margin spread; the fixed gamma of "w/o adaptive gamma" is stated
    in units of E||v||^2, so the ablation means the same whatever the hidden-state scale, and
    it is a different temperature (it changes lambda)."""
  h, p, a, m = random_batch(9)
  lam1, met1 = run(h, p, a, m)
  lam5, _ = run(5.0 * h, p, a, m)
  np.testing.assert_allclose(lam5, lam1, rtol=1e-5, atol=1e-6)
  opts = delta.ablation_options('no_adaptive_gamma')
  fix1, fmet = run(h, p, a, m, **opts)
  fix5, _ = run(5.0 * h, p, a, m, **opts)
  np.testing.assert_allclose(fix5, fix1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fix1, ref_delta(h, p, a, m, gamma=opts['gamma']), rtol=2e-5)
  assert not np.allclose(fix1, lam1, atol=1e-3)
  assert fmet['gamma_pos'] == pytest.approx(fmet['gamma_neg'])


# ------------------------------------------------------------------ geometry


def _toy_geometry(seed, n_per_side=4, t=10, frac_disc=0.3, noise=0.05):
  """Shared background direction s on both sides; a only positive, c only negative."""
  r = np.random.default_rng(seed)
  d = 6
  s, a_dir, c_dir = np.eye(d)[0], np.eye(d)[1], np.eye(d)[2]
  b = 2 * n_per_side
  h = np.zeros((b, t, d))
  disc = np.zeros((b, t), bool)
  n_disc = int(round(frac_disc * t))
  for i in range(b):
    own = a_dir if i < n_per_side else c_dir
    cols = r.permutation(t)[:n_disc]
    disc[i, cols] = True
    for j in range(t):
      h[i, j] = (own if disc[i, j] else s) + noise * r.normal(size=d)
  p = np.full((b, t), 0.3)
  adv = np.array([1.0] * n_per_side + [-1.0] * n_per_side)
  return h, p, adv, np.ones((b, t)), disc


def test_discriminative_tokens_get_larger_lambda():
  h, p, a, m, disc = _toy_geometry(0)
  for opts in ({}, {'num_refine': 0}, {'scope': 'group', 'group_size': 8}):
    lam, met = run(h, p, a, m, **opts)
    for rows in (slice(0, 4), slice(4, 8)):
      d_, s_ = disc[rows], ~disc[rows]
      assert lam[rows][d_].min() > lam[rows][s_].max()
    assert met['lam_pos_max'] > 1.0 and met['lam_neg_max'] > 1.0


def test_within_side_only_prefers_the_shared_tokens():
  """Own-side centrality favours the frequent shared tokens: the failure DelTA avoids."""
  h, p, a, m, disc = _toy_geometry(1)
  lam, _ = run(h, p, a, m, within_side_only=True)
  assert lam[disc].mean() < lam[~disc].mean()


def test_mirror_symmetric_batch_gives_equal_lambda_on_both_sides():
  """Negative side = mirror image of the positive side: a token with the same v on
    both sides gets the same lam on both sides (the shared one exactly 1)."""
  r = np.random.default_rng(2)
  half, t, d = 3, 6, 4
  perm = np.array([2, 3, 0, 1])  # reflection swapping coordinate blocks
  h_pos = r.normal(size=(half, t, d))
  shared = np.array([0.7, -0.2, 0.7, -0.2])  # fixed by the reflection
  h_pos[:, 0] = shared
  h = np.concatenate([h_pos, h_pos[..., perm]], axis=0)
  p = np.concatenate([r.uniform(0.1, 0.9, (half, t))] * 2)
  adv = np.array([1.0, 0.5, 2.0, -1.0, -0.5, -2.0])
  m = np.ones((2 * half, t))
  for opts in ({}, {'num_refine': 3, 'normalize': False}, {'gamma': 0.5, 'normalize': False}):
    lam, met = run(h, p, adv, m, **opts)
    np.testing.assert_allclose(lam[:half], lam[half:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lam[:, 0], lam[0, 0], rtol=1e-5)
    if not opts.get('normalize', True):
      np.testing.assert_allclose(lam[:, 0], 1.0, atol=1e-5)
    np.testing.assert_allclose(met['gamma_pos'], met['gamma_neg'], rtol=1e-5)


def test_identical_tokens_on_the_same_side_get_identical_lambda():
  h, p, a, m = random_batch(10)
  h[2, 1], p[2, 1] = h[0, 0], p[0, 0]  # rows 0 and 2 are both positive
  m[2, 1] = m[0, 0] = 1
  lam, _ = run(h, p, a, m)
  np.testing.assert_allclose(lam[2, 1], lam[0, 0], rtol=1e-6)


@pytest.mark.parametrize('sign', [1.0, -1.0])
def test_one_side_empty_gives_lambda_one(sign):
  h, p, a, m = random_batch(11)
  a = sign * np.abs(a)
  a[4] = 0.0
  for opts in ({}, {
      'scope': 'group',
      'group_size': 2
  }, {
      'soft_assignment': False
  }, {
      'within_side_only': True
  }):
    lam, met = run(h, p, a, m, **opts)
    assert np.all(np.isfinite(lam))
    np.testing.assert_allclose(lam[m > 0], 1.0)
    assert met['frac_one_sided'] == 1.0 and met['frac_scored'] == 0.0
    assert all(np.isfinite(v) for v in met.values())


def test_lambda_is_a_constant_for_autodiff():
  h, lp, a, m = inputs(*random_batch(12))
  grad = jax.jit(jax.grad(lambda hh: jnp.sum(delta.token_coefficients(hh, lp, a, m)[0]**2)))(h)
  assert np.all(np.asarray(grad) == 0.0)


# ------------------------------------------------------------------ ablations


def test_ablation_table_is_complete_and_runs():
  expected = {
      'full', 'no_adaptive_gamma', 'no_soft_assignment', 'no_normalization', 'no_range_map',
      'no_refinement', 'within_side_only', 'random_lambda', 'topk_proxy', 'select_top',
      'select_bottom', 'select_random', 'select_top_pooled', 'select_bottom_pooled',
      'select_random_pooled'
  }
  assert expected <= set(delta.DELTA_ABLATIONS)
  with pytest.raises(ValueError, match='no_such.*valid'):
    delta.ablation_options('no_such')
  h, p, a, m = random_batch(13)
  full, _ = run(h, p, a, m)
  r = np.random.default_rng(0)
  unembed = jnp.asarray(r.normal(size=(9, D)), jnp.float32)
  ids = jnp.asarray(r.integers(0, 9, (B, T)))
  for name in delta.DELTA_ABLATIONS:
    opts = delta.ablation_options(name)
    if opts.get('proxy') == 'topk_hidden':
      options, _ = split_options(dict(opts, topk=4))
      lam, met = jax.jit(lambda *x: delta.token_coefficients(*x, options, unembed_VD=unembed,
                                                             token_ids_BT=ids))(*inputs(h, p, a, m))
      lam, met = np.asarray(lam), {k: float(v) for k, v in met.items()}
    else:
      lam, met = run(h, p, a, m, rng=jax.random.PRNGKey(1), **opts)
    assert np.all(np.isfinite(lam)), name
    assert all(np.isfinite(v) for v in met.values()), name
    if name != 'full':
      assert not np.allclose(lam, full, atol=1e-4), name


def _ablation_lambda(name, h, p, a, m):
  opts = delta.ablation_options(name)
  if opts.get('proxy') == 'topk_hidden':
    r = np.random.default_rng(0)
    opts.update(unembed_VD=jnp.asarray(r.normal(size=(9, D)), jnp.float32),
                token_ids_BT=jnp.asarray(r.integers(0, 9, h.shape[:2])), topk=4)
  options, call = split_options(opts)
  lam, _ = delta.token_coefficients(*inputs(h, p, a, m), options, rng=jax.random.PRNGKey(1), **call)
  return lam


@pytest.mark.parametrize('name', sorted(set(delta.DELTA_ABLATIONS) - {'full'}))
def test_every_ablation_changes_the_loss_gradient(name):
  """An ablation must change what the update does, not only the numbers lambda shows:
    the gradient of the DelTA loss (objectives.delta, token_mean) w.r.t. the log-probs differs
    from full DelTA's. ('no_normalization' used to be a no-op: the loss renormalised.)"""
  from jtc import objectives
  h, p, a, m = random_batch(13)
  r = np.random.default_rng(4)
  logps = jnp.asarray(r.normal(-1.0, 0.3, (B, T)), jnp.float32)
  old = logps + jnp.asarray(r.normal(0.0, 0.1, (B, T)), jnp.float32)

  def grad_of(lam):
    f = lambda lp: objectives.compute_loss('delta', logps=lp, old_logps=old, advantages=jnp.asarray(
        a, jnp.float32), mask=jnp.asarray(m, jnp.float32), group_size=2, token_weights=lam)[0]
    return np.asarray(jax.grad(f)(logps))

  g_full = grad_of(_ablation_lambda('full', h, p, a, m))
  g_abl = grad_of(_ablation_lambda(name, h, p, a, m))
  assert np.abs(g_abl - g_full).max() > 1e-3 * np.abs(g_full).max(), name


def test_no_refinement_uses_unweighted_centroids():
  h, p, a, m = random_batch(14)
  lam0, _ = run(h, p, a, m, **delta.ablation_options('no_refinement'))
  np.testing.assert_allclose(lam0, ref_delta(h, p, a, m, num_refine=0), rtol=2e-5)
  lam1, _ = run(h, p, a, m)
  assert not np.allclose(lam0, lam1, atol=1e-5)


def test_hard_assignment_hits_the_bounds():
  h, p, a, m = random_batch(15)
  lam, _ = run(h, p, a, m, soft_assignment=False, normalize=False)
  scored = (m > 0) & (a[:, None] != 0)
  assert set(np.round(lam[scored], 6)) <= {0.8, 1.2}


def test_no_range_map_gives_raw_scores():
  h, p, a, m = random_batch(16)
  raw, _ = run(h, p, a, m, range_map=False, normalize=False)
  mapped, _ = run(h, p, a, m, normalize=False)
  scored = (m > 0) & (a[:, None] != 0)
  assert np.all((raw[scored] > 0) & (raw[scored] < 1))
  np.testing.assert_allclose(0.8 + 0.4 * raw[scored], mapped[scored], rtol=1e-5)


def test_random_lambda_is_in_range_and_ignores_geometry():
  h, p, a, m = random_batch(17)
  opts = dict(delta.ablation_options('random_lambda'), normalize=False)
  k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  lam, _ = run(h, p, a, m, rng=k1, **opts)
  lam_other_h, _ = run(-3.0 * h + 1.0, 1.0 - p, a, m, rng=k1, **opts)
  lam_other_key, _ = run(h, p, a, m, rng=k2, **opts)
  scored = (m > 0) & (a[:, None] != 0)
  assert np.all((lam[scored] >= 0.8) & (lam[scored] <= 1.2))
  np.testing.assert_array_equal(lam, lam_other_h)
  assert not np.allclose(lam[scored], lam_other_key[scored])


def test_within_side_only_ignores_the_opposite_side():
  h, p, a, m = random_batch(18)
  lam, _ = run(h, p, a, m, within_side_only=True, normalize=False)
  h2 = h.copy()
  h2[a < 0] = 10.0 * np.random.default_rng(0).normal(size=h2[a < 0].shape)
  lam2, _ = run(h2, p, a, m, within_side_only=True, normalize=False)
  np.testing.assert_allclose(lam2[a > 0], lam[a > 0], rtol=1e-5)
  assert not np.allclose(lam2[a < 0], lam[a < 0])


def test_topk_proxy_matches_reference_on_exact_hidden_gradient():
  r = np.random.default_rng(19)
  h, p, a, m = random_batch(19)
  w = r.normal(size=(8, D))
  ids = r.integers(0, 8, size=(B, T))
  lam, _ = delta.token_coefficients(*inputs(h, p, a, m),
                                    delta.DeltaOptions(proxy='topk_hidden', topk=8, chunk_size=7),
                                    unembed_VD=jnp.asarray(w, jnp.float32),
                                    token_ids_BT=jnp.asarray(ids))
  # Reference with v = grad_h log p(y): feed it as hidden with p = 0.
  logits = h @ w.T
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  v = w[ids] - probs @ w
  np.testing.assert_allclose(np.asarray(lam), ref_delta(v, np.zeros_like(p), a, m), rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize('selection', ['top_pooled', 'bottom_pooled', 'random_pooled'])
def test_pooled_selection_keeps_half_of_the_valid_tokens(selection):
  h, p, a, m = random_batch(20)
  lam, _ = run(h, p, a, m, normalize=False)
  sel, met = run(h, p, a, m, selection=selection, normalize=False)
  valid = m > 0
  n_keep = (valid.sum() + 1) // 2
  kept = sel > 0
  assert kept.sum() == n_keep and not np.any(kept & ~valid)
  assert set(np.unique(sel)) <= {0.0, 1.0}
  np.testing.assert_allclose(met['frac_selected'], n_keep / valid.sum())
  if selection == 'top_pooled':
    assert lam[kept].min() >= lam[valid & ~kept].max()
  elif selection == 'bottom_pooled':
    assert lam[kept].max() <= lam[valid & ~kept].min()
  normed, _ = run(h, p, a, m, selection=selection)
  np.testing.assert_allclose(normed[valid].mean(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(normed[kept], valid.sum() / n_keep, rtol=1e-6)


@pytest.mark.parametrize('selection', ['top', 'bottom', 'random'])
def test_selection_keeps_half_of_each_advantage_side(selection):
  """Figure 3 masks rank within each side: ceil(n/2) of the A > 0 and of the A < 0 tokens
    are kept (the same share on both sides), zero-advantage tokens are dropped, and inside a
    side top / bottom follow lambda."""
  h, p, a, m = random_batch(20)
  lam, _ = run(h, p, a, m, normalize=False)
  sel, met = run(h, p, a, m, selection=selection, normalize=False)
  kept = sel > 0
  for side in (a > 0, a < 0):
    on = (m > 0) & side[:, None]
    assert kept[on].sum() == (on.sum() + 1) // 2
    if selection == 'top':
      assert lam[on & kept].min() >= lam[on & ~kept].max()
    elif selection == 'bottom':
      assert lam[on & kept].max() <= lam[on & ~kept].min()
  assert not np.any(kept[a == 0]) and not np.any(kept & (m == 0))
  n_pos = ((m > 0) & (a > 0)[:, None]).sum()
  assert met['selected_pos_share'] == pytest.approx(((n_pos + 1) // 2) / kept.sum())


def test_pooled_top_selection_is_mostly_one_side_per_side_selection_is_not():
  """The failure the per-side rule fixes: when lambda differs mostly by side (positive
    tokens near 1.04, negative near 0.97, as on a confident policy), pooled top keeps almost
    only positive-side tokens while the per-side rule keeps both sides in proportion."""
  r = np.random.default_rng(3)
  b_, t_ = 8, 12
  h = r.normal(size=(b_, t_, D))
  h[4:] *= 3.0  # the negative side's centroid has the larger norm
  p = np.where(r.uniform(size=(b_, t_)) < 0.8, 0.999, 0.2)  # most tokens: v ~ 0
  a = np.array([1.0] * 4 + [-1.0] * 4)
  m = np.ones((b_, t_))
  _, pooled = run(h, p, a, m, selection='top_pooled')
  _, side = run(h, p, a, m, selection='top')
  assert pooled['selected_pos_share'] > 0.9
  assert side['selected_pos_share'] == pytest.approx(0.5)


def test_selection_per_group_in_group_scope():
  h, p, a, m = random_batch(21)
  sel, _ = run(h, p, a, m, selection='top_pooled', normalize=False, scope='group', group_size=3)
  for g in range(2):
    rows = slice(3 * g, 3 * g + 3)
    assert sel[rows].sum() == (m[rows].sum() + 1) // 2
  sel, _ = run(h, p, a, m, selection='top', normalize=False, scope='group', group_size=3)
  for g in range(2):
    rows = slice(3 * g, 3 * g + 3)
    for side in (a[rows] > 0, a[rows] < 0):
      on = (m[rows] > 0) & side[:, None]
      assert (sel[rows] > 0)[on].sum() == (on.sum() + 1) // 2


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize('bad, match', [
    ({
        'scope': 'prompt'
    }, 'prompt.*batch'),
    ({
        'proxy': 'full'
    }, 'full.*lm_head'),
    ({
        'selection': 'half'
    }, 'half.*top'),
    ({
        'scope': 'group',
        'group_size': 4
    }, 'group_size=4'),
    ({
        'scope': 'group'
    }, 'group_size=None'),
    ({
        'random_lambda': True
    }, 'rng'),
    ({
        'selection': 'random'
    }, 'rng'),
    ({
        'selection': 'random_pooled'
    }, 'rng'),
    ({
        'proxy': 'topk_hidden'
    }, 'unembed_VD'),
    ({
        'lam_min': 1.3
    }, 'lam_min'),
    ({
        'num_refine': -1
    }, 'num_refine'),
    ({
        'gamma': 0.0
    }, 'gamma'),
    ({
        'chunk_size': 0
    }, 'chunk_size'),
])
def test_bad_options_raise(bad, match):
  h, lp, a, m = inputs(*random_batch(0))
  with pytest.raises(ValueError, match=match):
    options, call = split_options(bad)
    delta.token_coefficients(h, lp, a, m, options, **call)


# ------------------------------------------------------------------ token clouds


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
