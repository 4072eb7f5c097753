"""Tests of jtc.objectives.delta: DelTA's coefficients against a numpy reference, their invariances
(chunking, dtype, permutation, masking, scale), the geometry they reward, token selection."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.objectives import delta
from tests.objectives.delta_reference import D, logp, inputs, run, random_batch, ref_delta

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
