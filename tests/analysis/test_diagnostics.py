"""Tests of jtc.analysis.diagnostics: closed forms from the paper and independent references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import diagnostics as dg
from jtc.analysis import grad_norms
from jtc.models import model
from jtc.models import logprobs
from jtc import objectives
from jtc.rl import update

G, P, T = 4, 3, 6
SHARED = 3  # completion positions 0..2 are shared by the whole group


def _cfg(**kw):
  return model.ModelConfig.tiny(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                head_dim=16, d_ff=64, **kw)


@pytest.fixture(scope='module')
def setup():
  cfg = _cfg()
  params = model.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  comp = rng.integers(3, 16, size=(G, T))
  comp[:, :SHARED] = [7, 8, 9]
  comp[:, SHARED] = [3, 4, 5, 6]  # the members diverge at position SHARED
  tokens = np.concatenate([np.tile([0, 5, 6], (G, 1)), comp], 1)
  inm = np.ones((G, P + T), np.int32)
  inm[:, 0] = 0  # left padding
  tokens, inm = jnp.asarray(tokens, jnp.int32), jnp.asarray(inm)
  # Behaviour policy = a slightly different policy (an earlier step), so ratios differ from 1
  # but stay well inside GRPO's clip range.
  noise = jax.tree.map(lambda x: 0.003 * jax.random.normal(jax.random.key(1), x.shape), params)
  old_params = jax.tree.map(jnp.add, params, noise)
  old = _seq_logps(old_params, cfg, tokens, inm)
  batch = update.Batch(tokens_BL=tokens, input_mask_BL=inm, mask_BT=jnp.ones((G, T)),
                       advantages_B=jnp.array([1.0, -1.0, 0.5, -0.5]), old_logps_BT=old)
  norms = jax.jit(grad_norms.exact_grad_norms, static_argnums=1,
                  static_argnames='completion_start')(params, cfg, tokens, inm, completion_start=P)
  return cfg, params, batch, norms


def _seq_logps(params, cfg, tokens, inm, completion_start=P):
  return _SEQ_LOGPS(params, cfg, tokens, inm, completion_start=completion_start)['logps']


_SEQ_LOGPS = jax.jit(logprobs.sequence_logprobs, static_argnums=1,
                     static_argnames=('completion_start',))

_NET_GRADIENT = jax.jit(dg.net_gradient, static_argnums=1, static_argnames=('completion_start',))


def test_asym_matches_numpy_loop():
  rng = np.random.default_rng(1)
  w, a = rng.uniform(0.5, 1.5, 12), rng.normal(size=12)
  per_group, mean = objectives.asym(jnp.asarray(w, jnp.float32), jnp.asarray(a, jnp.float32),
                                    group_size=3)
  ref = []
  for m in range(4):
    x = [w[3 * m + i] * a[3 * m + i] for i in range(3)]
    mu = sum(x) / 3
    ref.append(sum((v - mu)**2 for v in x) / 3)
  np.testing.assert_allclose(per_group, ref, rtol=1e-5)
  np.testing.assert_allclose(mean, np.mean(ref), rtol=1e-5)
  with pytest.raises(ValueError, match='group_size=5'):
    objectives.asym(jnp.ones(12), jnp.ones(12), group_size=5)


def test_shared_context_mask(setup):
  _, _, batch, _ = setup
  shared = dg.shared_context_mask(batch.tokens_BL, batch.input_mask_BL, batch.mask_BT, group_size=G,
                                  completion_start=P)
  expected = np.zeros((G, T), bool)
  expected[:, :SHARED] = True
  np.testing.assert_array_equal(shared, expected)
  # One member with a different first token breaks the event for the whole group.
  tokens = batch.tokens_BL.at[2, P].set(11)
  shared = dg.shared_context_mask(tokens, batch.input_mask_BL, batch.mask_BT, group_size=G,
                                  completion_start=P)
  assert not np.any(shared)


@pytest.mark.parametrize('name,hparams,cancels', [
    ('grpo', {}, True),
    ('grpo_fix', {}, True),
    ('dfpo_min_replace', {
        'eps': 0.2
    }, True),
    ('dfpo_pos_orth_proj', {
        'eps': 0.2
    }, True),
    ('gspo', {
        'eps': 0.2
    }, False),
])
def test_shared_token_residual(setup, name, hparams, cancels):
  cfg, params, batch, norms = setup
  logps = _seq_logps(params, cfg, batch.tokens_BL, batch.input_mask_BL)
  coef, _ = dg.loss_coefficients(logps, loss_name=name, old_logps=batch.old_logps_BT,
                                 advantages=batch.advantages_B, mask=batch.mask_BT, group_size=G,
                                 **hparams)
  shared = dg.shared_context_mask(batch.tokens_BL, batch.input_mask_BL, batch.mask_BT, group_size=G,
                                  completion_start=P)
  res = dg.shared_token_residual(coef, norms, shared, batch.mask_BT, group_size=G)
  assert float(res['shared_energy']) > 0.1
  # Independent check with exact vectors: the net gradient of all shared positions.
  net = _NET_GRADIENT(params, cfg, batch.tokens_BL, batch.input_mask_BL, coef * shared,
                      completion_start=P)
  net_norm = float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(net))))
  gross = float(jnp.sum(jnp.abs(coef) * norms * shared))
  if cancels:
    assert float(res['residual']) < 1e-5
    assert net_norm < 1e-5 * gross
  else:
    assert float(res['residual']) > 1e-3
    assert net_norm > 1e-3 * gross


def test_exact_grad_norms_match_grad_loop(setup):
  cfg, params, batch, norms = setup

  @jax.jit
  def grad_bt(p, b, t):
    f = lambda q: logprobs.sequence_logprobs(q, cfg, batch.tokens_BL, batch.input_mask_BL,
                                             completion_start=P)['logps'][b, t]
    return jax.grad(f)(p)

  for b, t in [(0, 0), (1, 4), (3, 5)]:
    grad = grad_bt(params, b, t)
    ref = np.sqrt(
        sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree_util.tree_leaves(grad)))
    np.testing.assert_allclose(norms[b, t], ref, rtol=1e-4)


def test_single_event_net_gradient_equals_coefficient_sum(setup):
  cfg, params, batch, norms = setup
  coef = jnp.asarray(np.random.default_rng(3).normal(size=(G, T)), jnp.float32)
  per_pos = jax.jit(dg.position_net_grad_norms, static_argnums=1,
                    static_argnames='completion_start')(params, cfg, batch.tokens_BL,
                                                        batch.input_mask_BL, coef,
                                                        completion_start=P)
  # Shared position 1: identical score vectors, so the net norm is |sum_i c_i| * ||g||.
  np.testing.assert_allclose(per_pos[1], abs(float(jnp.sum(coef[:, 1]))) * norms[0, 1], rtol=1e-4)


def test_frequency_buckets_and_energy_shares():
  counts = jnp.array([0, 0, 0, 50, 30, 10, 5, 5, 0, 0], jnp.float32)
  ids = jnp.array([[3, 4, 5, 6], [7, 3, 3, 9]])
  mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]])
  buckets = dg.token_frequency_buckets(ids, mask, counts, num_buckets=2)
  # id 3 holds the first 50% of the mass -> bucket 0; the rest start at >= 50% -> bucket 1.
  np.testing.assert_array_equal(buckets, [[0, 1, 1, 1], [1, 0, 0, 1]])
  norms = jnp.asarray(np.random.default_rng(5).uniform(size=(2, 4)), jnp.float32)
  shares = dg.energy_by_frequency(norms, buckets, mask, num_buckets=2)
  n, b, m = map(np.asarray, (norms, buckets, mask))
  ref0 = sum(n[i, j] for i in range(2) for j in range(4) if m[i, j] and b[i, j] == 0)
  tot = sum(n[i, j] for i in range(2) for j in range(4) if m[i, j])
  np.testing.assert_allclose(shares, [ref0 / tot, 1 - ref0 / tot], rtol=1e-5)
  assert float(jnp.sum(shares)) == pytest.approx(1.0)


@pytest.mark.parametrize('mode', ['proxy', 'exact'])
def test_step_diagnostics_jits(setup, mode):
  cfg, params, batch, _ = setup
  fn = jax.jit(
      lambda p, b: dg.step_diagnostics(p, cfg, b, loss_name='gspo', loss_hparams={'eps': 0.2},
                                       group_size=G, completion_start=P, mode=mode))
  out = fn(params, batch)
  assert all(np.isfinite(float(v)) for v in out.values())
  energy = sum(float(out[f'diag/energy_b{k}']) for k in range(3))
  assert energy == pytest.approx(1.0, abs=1e-5)
  assert float(out['diag/shared_frac']) == pytest.approx(SHARED / T)
  assert float(out['diag/shared_residual']) > 1e-3


_STEP_DIAG = {}


def _step_diag(params, cfg, batch, name, hparams=()):
  key = (name, hparams)
  if key not in _STEP_DIAG:
    _STEP_DIAG[key] = jax.jit(lambda p, b: dg.step_diagnostics(
        p, cfg, b, loss_name=name, loss_hparams=dict(hparams), group_size=G, completion_start=P))
  return {k: float(v) for k, v in _STEP_DIAG[key](params, batch).items()}


def test_step_diagnostics_tell_the_methods_apart_only_off_policy(setup):
  """Known-positive control of the trainer's instrument. On-policy (old = current log-probs,
  where the trainer used to measure) every ratio is 1 and GSPO, DFPO, GRPO and GRPO-fix give
  identical diagnostics. Off-policy (the behaviour policy is an earlier one) GSPO leaves a
  shared-token residual and DFPO (Min-Replace, literal reading) cancels it; with ratios outside
  GRPO's clip on the shared tokens GRPO leaves a residual and GRPO-fix (symmetric clip) cancels."""
  cfg, params, batch, _ = setup
  logps = _seq_logps(params, cfg, batch.tokens_BL, batch.input_mask_BL)
  on_policy = batch.replace(old_logps_BT=logps)
  names = ('gspo', 'dfpo_min_replace', 'grpo', 'grpo_fix')
  on = [_step_diag(params, cfg, on_policy, n) for n in names]
  for other in on[1:]:
    for k in on[0]:
      assert other[k] == pytest.approx(on[0][k], rel=1e-6, abs=1e-9), k
  # On-policy the group's pushes up and down balance (sum_i A_i = 0, equal lengths).
  assert on[0]['diag/mass_sign_balance'] == pytest.approx(0.5, abs=1e-6)
  assert on[0]['diag/mass_mean_p'] == pytest.approx(0.5)
  gspo = _step_diag(params, cfg, batch, 'gspo')
  dfpo = _step_diag(params, cfg, batch, 'dfpo_min_replace')
  assert gspo['diag/coef_mass_vs_gspo'] == pytest.approx(1.0)
  assert gspo['diag/shared_residual'] > 1e-2 and dfpo['diag/shared_residual'] < 1e-5
  # Shared tokens at ratio 0.6 (< 1 - eps): GRPO clips the A < 0 members only.
  old = batch.old_logps_BT.at[:, :SHARED].set(logps[:, :SHARED] + 0.51)
  clipped = batch.replace(old_logps_BT=old)
  grpo = _step_diag(params, cfg, clipped, 'grpo')
  fix = _step_diag(params, cfg, clipped, 'grpo_fix')
  assert grpo['diag/shared_residual'] > 1e-2 and fix['diag/shared_residual'] < 1e-5
