"""Tests of jtc.objectives: paper closed forms, token cancellation, numpy-loop references."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import objectives
from jtc.objectives import surrogates

G = 3
B = 6
T = 5
AGGS = sorted(objectives.AGGREGATIONS)
SEQ_LOSSES = ('gspo', 'gspo_token', 'dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj')


@functools.lru_cache(maxsize=None)
def _fn(name, group_size, hp_items, optional, aggs):
  """Jitted ((loss, metrics), grad wrt logps) for each aggregation in ``aggs`` (one compile)."""
  del optional  # part of the cache key only

  def one(agg, logps, old_logps, advantages, mask, extra):
    hp = dict(hp_items, **({'aggregation': agg} if agg else {}))
    return objectives.compute_loss(name, logps=logps, old_logps=old_logps, advantages=advantages,
                                   mask=mask, group_size=group_size, **extra, **hp)

  def f(*args):
    return tuple(
        jax.value_and_grad(functools.partial(one, agg), has_aux=True)(*args) for agg in aggs)

  return jax.jit(f)


def _run(name, logps, old_logps, adv, mask, aggs, *, group_size=G, ref=None, tw=None, ent=None,
         **hp):
  extra = {
      k: jnp.asarray(v, jnp.float32)
      for k, v in (('ref_logps', ref), ('token_weights', tw), ('entropy', ent))
      if v is not None
  }
  fn = _fn(name, group_size, tuple(sorted(hp.items())), tuple(sorted(extra)), aggs)
  outs = fn(jnp.asarray(logps, jnp.float32), jnp.asarray(old_logps, jnp.float32),
            jnp.asarray(adv, jnp.float32), jnp.asarray(mask, jnp.float32), extra)
  return [(float(loss), {
      k: float(v) for k, v in metrics.items()
  }, np.asarray(grad, np.float64)) for (loss, metrics), grad in outs]


def run(name, logps, old_logps, adv, mask, **kw):
  """(loss, metrics, grad) of one config; ``aggregation`` may be given in ``kw``."""
  return _run(name, logps, old_logps, adv, mask, (None,), **kw)[0]


def run_all_aggregations(name, logps, old_logps, adv, mask, **kw):
  return _run(name, logps, old_logps, adv, mask, tuple(AGGS), **kw)


# ---------------------------------------------------------------------------------------------
# Independent numpy references (plain loops, float64).
# ---------------------------------------------------------------------------------------------


def np_agg_weights(mask, mode):
  """kappa[i, t] with aggregate(x) = sum_{i,t} kappa x."""
  b, t = mask.shape
  k = np.zeros_like(mask, dtype=np.float64)
  n = max(mask.sum(), 1.0)
  for i in range(b):
    length = max(mask[i].sum(), 1.0)
    for j in range(t):
      if mask[i, j] > 0:
        k[i, j] = {
            'token_mean': 1 / n,
            'seq_mean_token_mean': 1 / (b * length),
            'seq_mean_token_sum': 1 / b,
            'seq_mean_token_sum_norm': 1 / (b * t)
        }[mode]
  return k


def np_qp(w, a):
  best, best_v = math.inf, None
  for bits in itertools.product([0, 1], repeat=len(w)):
    s = np.array(bits, bool)
    den = np.sum(a[s]**2)
    lam = np.sum(a[s] * w[s]) / den if den > 0 else 0.0
    v = np.where(s, w - lam * a, 0.0)
    if np.all(v >= -1e-12) and abs(np.dot(a, v)) < 1e-9 and 0.5 * np.sum((v - w)**2) < best:
      best, best_v = 0.5 * np.sum((v - w)**2), v
  return best_v


def np_transform(kind, w, a, hp):
  if hp.get('global_scale') is not None:
    return hp['global_scale'] * w
  if kind == 'dfpo_min_replace':
    return np.full_like(w, w.min())
  if kind == 'dfpo_orth_proj':
    return w - a * np.dot(a, w) / np.dot(a, a) if np.dot(a, a) > 0 else w
  if hp.get('solver', 'qp') == 'qp':
    return np_qp(w, a) if (a > 0).any() and (a < 0).any() else np.where(a != 0, 0.0, w)
  eps = hp.get('trunc_eps', 1e-3)
  s = np.maximum(w, eps)
  p, n = np.sum(np.clip(a, 0, None) * s), np.sum(np.clip(-a, 0, None) * s)
  if p > n:
    return np.where(a > 0, s * n / p, s)
  if p < n:
    return np.where(a < 0, s * p / n, s)
  return s


def np_reference(name, logps, old, adv, mask, hp, tw=None, ref=None, ent=None):
  """Returns (loss, grad wrt logps, metrics subset) computed with loops."""
  hp = {**objectives.default_hparams(name), **hp}
  b, t = logps.shape
  kappa = np_agg_weights(mask, hp['aggregation'])
  lr = np.where(mask > 0, logps - old, 0.0)
  r = np.exp(lr)
  obj = np.zeros((b, t))
  dobj = np.zeros((b, t))  # d obj[i,t] / d logp[i,t] for token losses
  low = np.zeros((b, t))
  high = np.zeros((b, t))
  w_traj = np.zeros(b)  # Eq. 14 weight (asym)
  w_grad = np.zeros(b)  # the weight the gradient carries (asym_gated)
  grad = np.zeros((b, t))
  lengths = np.maximum(mask.sum(1), 1.0)
  if name not in SEQ_LOSSES:
    lam_bar = np.ones((b, t))
    if name == 'delta':
      lam_bar = tw * mask  # arrives normalised from jtc.objectives.delta; the loss does not renormalise
    w14 = np.zeros((b, t))  # Eq. 14: the token ratio (times lambda for DelTA, clip for CISPO)
    for i in range(b):
      a = adv[i]
      for j in range(t):
        x = r[i, j]
        if name in ('grpo', 'dapo', 'dr_grpo', 'delta'):
          lo, hi = 1 - hp['eps_low'], 1 + hp['eps_high']
          c = min(max(x, lo), hi)
          if a >= 0:
            val, g = a * min(x, c), (x if x <= hi else 0.0)
            high[i, j] = float(a > 0 and x > hi)
          else:
            val, g = a * max(x, c), (x if x >= lo else 0.0)
            low[i, j] = float(x < lo)
            if hp['dual_clip_c'] is not None and max(x, c) > hp['dual_clip_c']:
              val, g = hp['dual_clip_c'] * a, 0.0
              high[i, j] = 1.0
          val, g = val * lam_bar[i, j], g * lam_bar[i, j]
          w14[i, j] = x * lam_bar[i, j]
        elif name == 'grpo_fix':
          hi = 1 + hp['eps_high']
          val, g = a * min(x, hi), (x if x < hi else 0.0)
          high[i, j] = float(x > hi)
          w14[i, j] = x
        elif name == 'cispo':
          c = min(max(x, 1 - hp['eps_low']), 1 + hp['eps_high'])
          val, g = a * c, c
          low[i, j], high[i, j] = float(x < 1 - hp['eps_low']), float(x > 1 + hp['eps_high'])
          w14[i, j] = c
        elif name == 'sapo':
          tau = hp['tau_pos'] if a > 0 else hp['tau_neg']
          sig = 1 / (1 + math.exp(-tau * (x - 1)))
          val, g = 4 / tau * sig * a, 4 * sig * (1 - sig) * x
          w14[i, j] = g
        obj[i, j], dobj[i, j] = val, g
      w_grad[i] = np.sum(dobj[i] * mask[i]) / lengths[i]
      w_traj[i] = np.sum(w14[i] * mask[i]) / lengths[i]
    grad = -kappa * adv[:, None] * dobj
  else:
    if hp['eps'] is not None:
      lo, hi = 1 - hp['eps'], 1 + hp['eps']
    else:
      lo, hi = 1 - hp['eps_low'], 1 + hp['eps_high']
    s = np.array([math.exp(np.sum(lr[i] * mask[i]) / lengths[i]) for i in range(b)])
    s_bar = np.zeros(b)
    free = np.zeros(b)
    for i in range(b):
      c = min(max(s[i], lo), hi)
      s_bar[i] = min(s[i], c) if adv[i] >= 0 else max(s[i], c)
      clipped_hi, clipped_lo = adv[i] > 0 and s[i] > hi, adv[i] < 0 and s[i] < lo
      high[i], low[i] = float(clipped_hi), float(clipped_lo)
      free[i] = 0.0 if (clipped_hi or clipped_lo) else 1.0
    if name in ('gspo', 'gspo_token'):
      coef = s * free
      seq_obj = adv * s_bar
      w_traj = s
    else:
      s_tilde = np.concatenate(
          [np_transform(name, s_bar[m:m + G_], adv[m:m + G_], hp) for m in range(0, b, G_)])
      coef = s_tilde * (free if hp.get('clip_gating') == 'gspo' else 1.0)
      seq_obj = adv * s_tilde
      w_traj = s_tilde
    w_grad = coef
    obj = seq_obj[:, None] * np.ones((b, t))
    big_k = kappa.sum(1)
    grad = -(big_k * adv * coef)[:, None] * mask / lengths[:, None]
  loss = -np.sum(kappa * obj)
  if ref is not None:
    d = np.where(mask > 0, ref - logps, 0.0)
    est = hp['kl_estimator']
    k = {'k1': -d, 'k2': 0.5 * d**2, 'k3': np.exp(d) - d - 1}[est]
    dk = {'k1': np.ones_like(d), 'k2': -d, 'k3': 1 - np.exp(d)}[est]
    loss += hp['kl_coef'] * np.sum(kappa * k)
    grad += hp['kl_coef'] * kappa * dk
  if ent is not None:
    loss -= hp['entropy_coef'] * np.sum(kappa * ent)
  n = max(mask.sum(), 1.0)
  wa = (w_traj * adv).reshape(-1, G_)
  wa_grad = (w_grad * adv).reshape(-1, G_)
  metrics = {
      'clip_frac_low': np.sum(low * mask) / n,
      'clip_frac_high': np.sum(high * mask) / n,
      'ratio_mean': np.sum(r * mask) / n,
      'ratio_min': r[mask > 0].min(),
      'ratio_max': r[mask > 0].max(),
      'approx_kl': np.sum((r - 1 - np.log(r)) * mask) / n,
      'asym': np.mean(wa.var(axis=1)),
      'asym_gated': np.mean(wa_grad.var(axis=1)),
      'frac_degenerate_groups': np.mean([len(set(g_)) == 1 for g_ in adv.reshape(-1, G_)]),
  }
  if ent is not None:  # logged as the per-token mean whatever the aggregation
    metrics['entropy'] = np.sum(ent * mask) / n
  return loss, grad, metrics


G_ = G


def _inputs(seed, *, noise=0.25):
  rng = np.random.default_rng(seed)
  logps = rng.normal(-1.5, 0.5, (B, T))
  old = logps + rng.normal(0.0, noise, (B, T))
  mask = np.zeros((B, T))
  for i, length in enumerate([5, 3, 4, 0, 2, 5]):  # row 3 fully masked
    mask[i, :length] = 1
  adv = rng.normal(size=B)
  adv = (adv.reshape(-1, G) - adv.reshape(-1, G).mean(1, keepdims=True)).reshape(-1)
  tw = rng.uniform(0.8, 1.2, (B, T))
  ref = logps + rng.normal(0.0, 0.3, (B, T))
  ent = rng.uniform(0.0, 2.0, (B, T))
  return logps, old, adv, mask, tw, ref, ent


_REF_SEED = 5


def _reference_hparams(name):
  hp = {
      'kl_coef': 0.05,
      'entropy_coef': 0.01,
      'kl_estimator': ['k1', 'k2', 'k3'][sorted(objectives.LOSSES).index(name) % 3]
  }
  if name in SEQ_LOSSES:
    hp.update(eps_low=0.05, eps_high=0.08)
  if name in ('grpo', 'delta'):
    hp['dual_clip_c'] = 1.3
  return hp


@pytest.mark.parametrize('name', sorted(objectives.LOSSES))
def test_every_loss_and_aggregation_matches_numpy_loops(name):
  logps, old, adv, mask, tw, ref, ent = _inputs(_REF_SEED)
  hp = _reference_hparams(name)
  results = run_all_aggregations(name, logps, old, adv, mask, ref=ref, ent=ent,
                                 tw=tw if name == 'delta' else None, **hp)
  for agg, (loss, metrics, grad) in zip(AGGS, results):
    ref_loss, ref_grad, ref_metrics = np_reference(name, logps, old, adv, mask, {
        **hp, 'aggregation': agg
    }, tw=tw, ref=ref, ent=ent)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6, err_msg=agg)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6, err_msg=agg)
    for k, v in ref_metrics.items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-4, atol=1e-6, err_msg=f'{agg} {k}')
    assert 'kl' in metrics and 'entropy' in metrics


def test_reference_inputs_exercise_clipping():
  """Guards the reference test: its inputs clip on both sides and for sequences."""
  logps, old, adv, mask, _, _, _ = _inputs(_REF_SEED)
  for name in ('grpo', 'gspo'):
    _, _, m = np_reference(name, logps, old, adv, mask, {
        **_reference_hparams(name), 'aggregation': 'token_mean'
    })
    assert m['clip_frac_low'] > 0 and m['clip_frac_high'] > 0


def test_dfpo_variants_with_solver_and_global_scale_match_numpy():
  logps, old, adv, mask, _, _, _ = _inputs(1)
  for name, hp in [('dfpo_pos_orth_proj', {
      'solver': 'truncate_rebalance',
      'trunc_eps': 0.5
  }), ('dfpo_min_replace', {
      'global_scale': 0.5
  }), ('dfpo_orth_proj', {
      'eps': 0.1
  })]:
    hp = {**hp, 'aggregation': 'token_mean'}
    loss, _, grad = run(name, logps, old, adv, mask, **hp)
    ref_loss, ref_grad, _ = np_reference(name, logps, old, adv, mask, hp)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Token gradient cancellation (paper Sec. 3.4, Eq. 9, 13, 38, 75/76, 82, 72-73).
# ---------------------------------------------------------------------------------------------


def _shared_group(seed, *, shared_log_ratio, g=4, t=6, noise=0.3):
  """One group of equal-length completions sharing (context, token) at t < len(shared)."""
  rng = np.random.default_rng(seed)
  logps = rng.normal(-1.0, 0.5, (g, t))
  old = logps + rng.normal(0.0, noise, (g, t))
  for j, lr in enumerate(shared_log_ratio):
    logps[:, j] = logps[0, j]
    old[:, j] = logps[0, j] - lr
  adv = rng.normal(size=g)
  adv -= adv.mean()
  return logps, old, adv, np.ones((g, t))


@pytest.mark.parametrize(
    'name,hp,shared',
    [
        ('grpo', {}, [0.1, -0.1, 0.05]),  # inside the clip range
        ('dapo', {}, [0.2, -0.15]),
        ('grpo_fix', {}, [0.6, -0.8, 0.0]),  # any ratio
        ('grpo_fix', {
            'aggregation': 'token_mean'
        }, [0.6, -0.8]),
        ('dfpo_min_replace', {}, [0.5, -0.3]),
        ('dfpo_orth_proj', {}, [0.5, -0.3]),
        ('dfpo_pos_orth_proj', {}, [0.5, -0.3]),
        ('dfpo_pos_orth_proj', {
            'solver': 'truncate_rebalance'
        }, [0.5, -0.3]),
        ('dfpo_min_replace', {
            'aggregation': 'token_mean'
        }, [0.5, -0.3]),
    ])
def test_shared_token_gradient_cancels(name, hp, shared):
  logps, old, adv, mask = _shared_group(2, shared_log_ratio=shared)
  _, _, grad = run(name, logps, old, adv, mask, group_size=4, **hp)
  group_sum = grad.sum(axis=0)
  np.testing.assert_allclose(group_sum[:len(shared)], 0.0, atol=1e-6)
  assert np.abs(grad).max() > 1e-3  # the loss does learn elsewhere


def test_gspo_shared_token_eq13_closed_form():
  """Eq. 13 with Eq. 44 ratios: sum_i dJ/dlogp_{i,t*} = (1/G)(1/T) sum_i A_i s_i (non-zero)."""
  g, t = 4, 6
  logps, old, adv, mask = _shared_group(3, shared_log_ratio=[0.1, -0.2], g=g, t=t)
  _, _, grad = run('gspo', logps, old, adv, mask, group_size=g, eps=10.0)  # linear segment
  s = np.exp((logps - old).mean(axis=1))
  expected = np.sum(adv * s) / (g * t)
  np.testing.assert_allclose(-grad.sum(axis=0)[:2], expected, rtol=1e-5)
  assert abs(expected) > 1e-3  # no cancellation


def test_gspo_eq38_minimal_case():
  """App. A.2: G=2, T=3, shared (rho1, rho2), last tokens lambda1 != lambda2, A = (-a, a)."""
  a, rho1, rho2, lam1, lam2 = 0.7, 1.1, 0.95, 1.3, 0.8
  logps = np.log(np.array([[0.3, 0.5, 0.2], [0.3, 0.5, 0.6]]))
  ratios = np.array([[rho1, rho2, lam1], [rho1, rho2, lam2]])
  old = logps - np.log(ratios)
  _, _, grad = run('gspo', logps, old, np.array([-a, a]), np.ones((2, 3)), group_size=2, eps=10.0)
  # Eq. 38 with length-normalised weights s_i = (rho1 rho2 lambda_i)^(1/3), times 1/G * 1/T.
  eq38 = a * (rho1 * rho2)**(1 / 3) * (lam2**(1 / 3) - lam1**(1 / 3))
  np.testing.assert_allclose(-grad.sum(axis=0)[:2], eq38 / (2 * 3), rtol=1e-5)


@pytest.mark.parametrize('w,eq', [(1.5, 75), (0.6, 76)])
def test_grpo_outside_clip_range_eq75_76(w, eq):
  a, eps = 0.8, 0.2
  adv = np.array([-a, a])
  # Value: only the shared token is real, so the loss is -(1/G) * (Eq. 75/76 coefficient).
  logps = np.full((2, 1), -1.0)
  old = logps - math.log(w)
  loss, _, grad = run('grpo', logps, old, adv, np.ones((2, 1)), group_size=2)
  coef = a * ((1 + eps) - w) if eq == 75 else a * (w - (1 - eps))
  np.testing.assert_allclose(-loss, coef / 2, rtol=1e-5)
  assert abs(coef) > 1e-3
  # Gradient: only the unclipped branch moves (w > 1+eps: the A<0 one; w < 1-eps: the A>0 one).
  expected = (-a * w if eq == 75 else a * w) / 2
  np.testing.assert_allclose(-grad.sum(axis=0), expected, rtol=1e-5)
  # Same at a shared position inside longer completions (1/T from seq_mean_token_mean).
  logps, old, _, mask = _shared_group(4, shared_log_ratio=[math.log(w)], g=2, t=4)
  _, _, grad = run('grpo', logps, old, adv, mask, group_size=2)
  np.testing.assert_allclose(-grad.sum(axis=0)[0], expected / 4, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# DFPO semantics: Theorem C.1, stop-gradient ablation, global scale.
# ---------------------------------------------------------------------------------------------


def test_theorem_c1_min_replace_never_reverses_updates():
  logps, old, adv, mask, _, _, _ = _inputs(5, noise=0.4)
  keep = mask > 0
  _, _, g_min = run('dfpo_min_replace', logps, old, adv, mask, eps=10.0)
  _, _, g_base = run('gspo', logps, old, adv, mask, eps=10.0)  # Eq. 86 coefficient s_i A_i
  np.testing.assert_array_equal(np.sign(g_min[keep]), np.sign(g_base[keep]))
  phi = g_min[keep] / g_base[keep]
  assert np.all(phi > 0) and np.all(phi <= 1 + 1e-6)


@pytest.mark.parametrize('name,hp', [('dfpo_min_replace', {}), ('dfpo_orth_proj', {}),
                                     ('dfpo_pos_orth_proj', {}),
                                     ('dfpo_pos_orth_proj', {
                                         'solver': 'truncate_rebalance'
                                     })])
def test_no_stop_gradient_is_identically_zero(name, hp):
  """Documented identity: sum_i A_i = 0 and equal per-completion weights => J == 0."""
  logps, old, adv, mask, _, _, _ = _inputs(6, noise=0.4)
  mask[3, :2] = 1.0  # every completion real: equal weight 1/B per completion
  loss, _, grad = run(name, logps, old, adv, mask, stop_gradient=False, eps=0.1, **hp)
  assert abs(loss) < 1e-6
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)
  _, _, grad_sg = run(name, logps, old, adv, mask, stop_gradient=True, eps=0.1, **hp)
  assert np.abs(grad_sg).max() > 1e-3  # the default (stop-grad) variant does learn


def test_global_scale_without_stop_gradient_is_scaled_gspo():
  logps, old, adv, mask, _, _, _ = _inputs(7)
  loss_g, _, grad_g = run('gspo', logps, old, adv, mask, eps=0.1)
  loss_s, _, grad_s = run('dfpo_orth_proj', logps, old, adv, mask, eps=0.1, global_scale=0.5,
                          stop_gradient=False)
  np.testing.assert_allclose(loss_s, 0.5 * loss_g, rtol=1e-5)
  np.testing.assert_allclose(grad_s, 0.5 * grad_g, rtol=1e-5, atol=1e-7)


def test_gspo_token_equals_gspo():
  logps, old, adv, mask, _, _, _ = _inputs(8)
  for a, b in zip(run_all_aggregations('gspo', logps, old, adv, mask, eps=0.05),
                  run_all_aggregations('gspo_token', logps, old, adv, mask, eps=0.05)):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    np.testing.assert_allclose(a[2], b[2], rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# DFPO's two readings of GSPO's clip (clip_gating), the effective step, Eq. 23 Asym.
# ---------------------------------------------------------------------------------------------

DFPO_LOSSES = ('dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj')


def _off_policy(seed=11, noise=0.02):
  """Inputs at the paper's eps (3e-4 / 4e-4) where GSPO clips some trajectories, not all."""
  logps, old, adv, mask, _, _, _ = _inputs(seed, noise=noise)
  s = np.exp(
      np.array([np.sum((logps[i] - old[i]) * mask[i]) / max(mask[i].sum(), 1) for i in range(B)]))
  clipped = ((adv > 0) & (s > 1 + 4e-4)) | ((adv < 0) & (s < 1 - 3e-4))
  return logps, old, adv, mask, clipped


def test_off_policy_inputs_clip_some_trajectories():
  *_, clipped = _off_policy()
  assert 0 < clipped.sum() < B - 1


@pytest.mark.parametrize('name', DFPO_LOSSES)
def test_clip_gating_closed_forms(name):
  """Both readings have the value A_i s_tilde_i; literal: every trajectory's tokens carry
  s_tilde_i A_i alpha_{i,t}; gated: the same where GSPO's clip is inactive and exactly 0 where
  it is active (numpy reference with the gate)."""
  logps, old, adv, mask, clipped = _off_policy()
  for gating in surrogates.CLIP_GATINGS:
    hp = {'clip_gating': gating, 'aggregation': 'seq_mean_token_mean'}
    loss, metrics, grad = run(name, logps, old, adv, mask, **hp)
    ref_loss, ref_grad, ref_metrics = np_reference(name, logps, old, adv, mask, hp)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(metrics['asym_gated'], ref_metrics['asym_gated'], rtol=1e-4)
    if gating == 'gspo':
      assert np.all(grad[clipped] == 0.0)
      assert metrics['frac_traj_gated'] == pytest.approx(clipped.sum() / (mask.sum(1) > 0).sum())
    else:
      assert np.all(np.abs(grad[clipped & (mask.sum(1) > 0)]).sum(1) > 0)
      assert metrics['frac_traj_gated'] == 0.0


def test_gated_min_replace_coefficients_never_exceed_gspo_theorem_c1():
  """Thm C.1 under GSPO's gating: |coefficient| <= GSPO's per token, same sign where non-zero,
  and exactly 0 on the trajectories GSPO drops. The literal reading exceeds GSPO there."""
  logps, old, adv, mask, clipped = _off_policy()
  _, _, g_gspo = run('gspo', logps, old, adv, mask)
  _, _, g_gated = run('dfpo_min_replace', logps, old, adv, mask, clip_gating='gspo')
  _, _, g_literal = run('dfpo_min_replace', logps, old, adv, mask)
  assert np.all(np.abs(g_gated) <= np.abs(g_gspo) * (1 + 1e-6) + 1e-9)
  nz = g_gated != 0
  np.testing.assert_array_equal(np.sign(g_gated[nz]), np.sign(g_gspo[nz]))
  assert np.abs(g_literal[clipped]).sum() > 0 and np.all(g_gspo[clipped] == 0)


def test_shared_tokens_cancel_without_gating_and_not_with_it():
  """Literal DFPO cancels exactly on shared tokens whatever the clip does; the gated reading
  cancels only among kept trajectories, so it cancels when the clip is inactive."""
  logps, old, adv, mask = _shared_group(2, shared_log_ratio=[0.5, -0.3], noise=0.3)
  _, _, g_literal = run('dfpo_min_replace', logps, old, adv, mask, group_size=4)
  np.testing.assert_allclose(g_literal.sum(axis=0)[:2], 0.0, atol=1e-7)
  _, m, g_gated = run('dfpo_min_replace', logps, old, adv, mask, group_size=4, clip_gating='gspo')
  assert 0 < m['frac_traj_gated'] < 1
  assert np.abs(g_gated.sum(axis=0)[:2]).max() > 1e-4
  _, m, g_wide = run('dfpo_min_replace', logps, old, adv, mask, group_size=4, clip_gating='gspo',
                     eps=10.0)
  assert m['frac_traj_gated'] == 0.0
  np.testing.assert_allclose(g_wide.sum(axis=0)[:2], 0.0, atol=1e-7)


def test_gated_global_scale_is_exactly_c_times_gspo():
  """Table 3 "scale by c" under the gated reading is c x GSPO's gradient (a smaller step);
  the literal reading carries more than c x GSPO's mass (it keeps the clipped trajectories)."""
  logps, old, adv, mask, _ = _off_policy()
  _, m_g, g_gspo = run('gspo', logps, old, adv, mask)
  _, m_s, g_s = run('dfpo_min_replace', logps, old, adv, mask, global_scale=0.5, clip_gating='gspo')
  np.testing.assert_allclose(g_s, 0.5 * g_gspo, rtol=1e-5, atol=1e-9)
  assert m_s['coef_mass_vs_gspo'] == pytest.approx(0.5, rel=1e-5)
  _, m_lit, _ = run('dfpo_min_replace', logps, old, adv, mask, global_scale=0.5)
  assert m_lit['coef_mass_vs_gspo'] > 0.5 + 1e-3
  assert m_g['coef_mass_vs_gspo'] == pytest.approx(1.0)


@pytest.mark.parametrize('name', sorted(objectives.LOSSES))
def test_effective_step_metrics_match_the_gradient(name):
  """coef_mass = sum |d pg_loss / d log pi| (jax.grad of the loss itself, no KL / entropy),
  coef_mass_vs_gspo = that over GSPO's on the same inputs, frac_traj_gated counts the live
  trajectories with an all-zero gradient."""
  logps, old, adv, mask, _ = _off_policy(noise=0.3)
  tw = np.random.default_rng(0).uniform(0.8, 1.2, (B, T)) if name == 'delta' else None
  _, m, grad = run(name, logps, old, adv, mask, tw=tw)
  gspo_hp = ({
      k: objectives.default_hparams(name)[k] for k in ('eps_low', 'eps_high', 'eps')
  } if name in SEQ_LOSSES else {})
  agg = objectives.default_hparams(name)['aggregation']
  _, _, g_gspo = run('gspo', logps, old, adv, mask, aggregation=agg, **gspo_hp)
  np.testing.assert_allclose(m['coef_mass'], np.abs(grad).sum(), rtol=1e-5)
  np.testing.assert_allclose(m['coef_mass_vs_gspo'],
                             np.abs(grad).sum() / np.abs(g_gspo).sum(), rtol=1e-5)
  live = (adv != 0) & (mask.sum(1) > 0)
  gated = live & np.all(grad == 0, axis=1)
  assert m['frac_traj_gated'] == pytest.approx(gated.sum() / live.sum())


def test_asym_is_eq23_on_policy_it_is_var_a_for_every_method():
  """With Eq. 14's weights GSPO's Asym uses s_i clipped or not (the gated variant drops them);
  on-policy every weight is 1, so Asym = mean Var(A) for every method (it cannot tell methods
  apart there)."""
  logps, old, adv, mask, clipped = _off_policy()
  _, m, _ = run('gspo', logps, old, adv, mask)
  s = np.exp(
      np.array([np.sum((logps[i] - old[i]) * mask[i]) / max(mask[i].sum(), 1) for i in range(B)]))
  np.testing.assert_allclose(m['asym'], np.mean((s * adv).reshape(-1, G).var(1)), rtol=1e-5)
  np.testing.assert_allclose(m['asym_gated'],
                             np.mean((np.where(clipped, 0, s) * adv).reshape(-1, G).var(1)),
                             rtol=1e-5)
  var_a = np.mean(adv.reshape(-1, G).var(1))
  mask[3, :2] = 1.0  # a fully masked row has token-mean weight 0, not 1
  for name in sorted(objectives.LOSSES):
    if name in ('sapo', 'delta'):
      continue  # their Eq. 14 weight is not 1 at r = 1 (gate derivative, lambda)
    _, m, _ = run(name, logps, logps, adv, mask)
    np.testing.assert_allclose(m['asym'], var_a, rtol=1e-5, err_msg=name)


def test_clip_gating_validation():
  with pytest.raises(ValueError, match=r"clip_gating='ppo'.*\['gspo', 'none'\]"):
    _call('dfpo_min_replace', clip_gating='ppo')
  with pytest.raises(ValueError, match='stop_gradient=True'):
    _call('dfpo_min_replace', clip_gating='gspo', stop_gradient=False)
  with pytest.raises(ValueError, match='clip_gating'):
    _call('gspo', clip_gating='gspo')  # GSPO gates by definition; not a GSPO hyper-parameter


# ---------------------------------------------------------------------------------------------
# Robustness and input validation.
# ---------------------------------------------------------------------------------------------

_DEGENERATE_CONFIGS = [(n, None) for n in sorted(objectives.LOSSES)] + [(n, {
    'stop_gradient': False,
    'eps': 0.1
}) for n in ('dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj')] + [
    ('dfpo_pos_orth_proj', {
        'stop_gradient': False,
        'eps': 0.1,
        'solver': 'truncate_rebalance'
    })
]


@pytest.mark.parametrize('name,hp', _DEGENERATE_CONFIGS)
def test_degenerate_inputs_are_finite(name, hp):
  logps, old, adv, mask, tw, ref, ent = _inputs(9)
  mask[4] = 0.0  # fully masked completion in group 1
  adv[:G] = 0.0  # zero-std group 0
  old[G:] = logps[G:]  # group 1: all weights equal (r = 1)
  old[5, :] = logps[5, :] + 200.0  # weight exp(-200) == 0 in float32
  logps[4, :] = -np.inf  # padding may hold -inf
  ref[4, :] = np.nan
  tw[2, :] = 0.0

  def results(mask):
    if hp is None:  # the reference-test configs, with KL and entropy terms
      return run_all_aggregations(name, logps, old, adv, mask, ref=ref, ent=ent,
                                  tw=tw if name == 'delta' else None, **_reference_hparams(name))
    return [run(name, logps, old, adv, mask, **hp)]

  for loss, metrics, grad in results(mask):
    assert np.isfinite(loss)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[4] == 0.0)
    for k, v in metrics.items():
      assert np.isfinite(v), k
    assert metrics['frac_degenerate_groups'] == 0.5
  for loss, metrics, grad in results(np.zeros_like(mask)):  # whole batch masked
    assert np.isfinite(loss) and np.all(grad == 0.0)
    assert all(np.isfinite(v) for v in metrics.values())


def _call(name='grpo', b=4, t=3, g=2, **kw):
  args = dict(logps=jnp.zeros((b, t)), old_logps=jnp.zeros((b, t)), advantages=jnp.zeros((b,)),
              mask=jnp.ones((b, t)), group_size=g)
  args.update(kw)
  return objectives.compute_loss(name, **args)


def test_bad_inputs_raise_value_errors():
  with pytest.raises(ValueError, match=r"'ppo'.*valid: \['cispo'"):
    _call('ppo')
  with pytest.raises(ValueError, match=r"aggregation='mean'.*valid: \['seq_mean_token_mean'"):
    _call(aggregation='mean')
  with pytest.raises(ValueError, match=r"\['eps'\].*valid:.*eps_high"):
    _call(eps=0.1)  # grpo has eps_low/eps_high, not the GSPO eps
  with pytest.raises(ValueError, match=r"kl_estimator='k4'.*\['k1', 'k2', 'k3'\]"):
    _call(kl_estimator='k4')
  with pytest.raises(ValueError, match=r"solver='cg'.*\['qp', 'truncate_rebalance'\]"):
    _call('dfpo_pos_orth_proj', solver='cg')
  with pytest.raises(ValueError, match='group_size=3 must be a positive int dividing'):
    _call(g=3)
  with pytest.raises(ValueError, match='old_logps'):
    _call(old_logps=jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match='mask'):
    _call(mask=jnp.ones((3, 3)))
  with pytest.raises(ValueError, match='advantages'):
    _call(advantages=jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match='logps'):
    _call(logps=jnp.zeros((4,)))
  with pytest.raises(ValueError, match='token_weights'):
    _call('delta')
  with pytest.raises(ValueError, match='token_weights'):
    _call('grpo', token_weights=jnp.ones((4, 3)))
  with pytest.raises(ValueError, match='ref_logps'):
    _call(kl_coef=0.1)
  with pytest.raises(ValueError, match='entropy'):
    _call(entropy_coef=0.1)
  with pytest.raises(ValueError, match='dual_clip_c'):
    _call(dual_clip_c=0.5)


def test_default_hparams_cover_the_signature_and_round_trip():
  for name in objectives.LOSSES:
    hp = objectives.default_hparams(name)
    assert {'aggregation', 'kl_coef', 'kl_estimator', 'entropy_coef'} <= set(hp)
    assert hp['aggregation'] in objectives.AGGREGATIONS
  assert objectives.default_hparams('dfpo_pos_orth_proj')['solver'] == 'qp'
  assert objectives.default_hparams('dapo')['eps_high'] == 0.28
  with pytest.raises(ValueError, match='valid'):
    objectives.default_hparams('nope')
