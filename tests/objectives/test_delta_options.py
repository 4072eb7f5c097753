"""Tests of jtc.objectives.delta_options: the named ablations (each one runs and changes the
gradient, as its definition says) and bad options named before any compute."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.objectives import delta
from tests.objectives.delta_reference import B, T, D, split_options, inputs, run, random_batch, ref_delta


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
