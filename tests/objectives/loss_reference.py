"""Independent references for the loss tests: every loss and aggregation as numpy loops, the
inputs they are checked on, and `run`, which calls `objectives.compute_loss` jitted."""
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jtc import objectives

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


def reference_inputs(seed, *, noise=0.25):
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


def off_policy_inputs(seed=11, noise=0.02):
  """Inputs at the paper's eps (3e-4 / 4e-4) where GSPO clips some trajectories, not all."""
  logps, old, adv, mask, _, _, _ = reference_inputs(seed, noise=noise)
  s = np.exp(
      np.array([np.sum((logps[i] - old[i]) * mask[i]) / max(mask[i].sum(), 1) for i in range(B)]))
  clipped = ((adv > 0) & (s > 1 + 4e-4)) | ((adv < 0) & (s < 1 - 3e-4))
  return logps, old, adv, mask, clipped
