"""jtc's objectives as plain loss functions of torch or jax arrays, the signature `jtc conform` checks:

  fn(logp, old_logp, advantages, mask, *, aggregation=..., group_size=None, num_tokens=None,
     num_sequences=None, dp_size=1, norm_length=None, token_weights=None, **hparams) -> loss

``logp`` [B, T] (differentiable), ``old_logp`` [B, T], ``advantages`` [B], ``mask`` [B, T] (0 / 1).
Each function works on torch tensors or jax arrays alike (the ops follow the input's type) and is
written from the formulas of `jtc.objectives.surrogates` and `jtc.objectives.group_transforms`
(Eq. numbers there), not by calling them: a second, independent implementation, and the reference
a framework author can read. ``num_tokens`` / ``num_sequences`` are the global batch's real tokens
and rows when a micro-batch or a data-parallel shard is given (the local counts otherwise),
``dp_size`` multiplies the loss to undo the ranks' gradient averaging, ``norm_length`` is
seq_mean_token_sum_norm's constant length (the padded width otherwise): with them a loss is the
same whatever the split (`jtc conform --accumulation sum`).

Dimension key (docs/dimensions.md): B rows (groups of G contiguous), M groups, G group size,
T completion length.
"""

import math


class _Ops:
  """The few array ops the objectives need, for torch or jax."""

  def __init__(self, x):
    if type(x).__module__.startswith('torch'):
      import torch  # pylint: disable=import-outside-toplevel
      self.torch, self.np = True, torch
      self.sg = lambda a: a.detach()
      self.clip = lambda a, lo, hi: torch.clamp(a, lo, hi)
      self.amin = lambda a, axis: torch.amin(a, dim=axis)
      self.amax = lambda a, axis: torch.amax(a, dim=axis)
      self.sum = lambda a, axis=None: a.sum() if axis is None else a.sum(dim=axis)
      self.sigmoid = torch.sigmoid
      self.full = lambda a, v: torch.full_like(a, v)
    else:
      import jax  # pylint: disable=import-outside-toplevel
      import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
      self.torch, self.np = False, jnp
      self.sg = jax.lax.stop_gradient
      self.clip = jnp.clip
      self.amin = lambda a, axis: jnp.min(a, axis=axis)
      self.amax = lambda a, axis: jnp.max(a, axis=axis)
      self.sum = lambda a, axis=None: jnp.sum(a, axis=axis)
      self.sigmoid = jax.nn.sigmoid
      self.full = lambda a, v: jnp.full_like(a, v)
    self.exp, self.where, self.abs = self.np.exp, self.np.where, self.np.abs
    self.minimum, self.maximum = self.np.minimum, self.np.maximum

  def safe_div(self, num, den):
    ok = den != 0
    return self.where(ok, num / self.where(ok, den, self.full(den, 1.0)), self.full(num, 0.0))


# ---------------------------------------------------------------------------------------------
# Aggregations (jtc.objectives.loss.AGGREGATIONS), with the global counts of a split batch.
# ---------------------------------------------------------------------------------------------


def aggregate(o, x_BT, m_BT, aggregation, *, num_tokens=None, num_sequences=None, dp_size=1,
              norm_length=None):
  """The aggregation of x over the real tokens (module docstring for the counts)."""
  B, T = x_BT.shape
  rows = num_sequences or B
  total = o.sum(x_BT * m_BT)
  if aggregation == 'token_mean':
    value = total / (num_tokens if num_tokens else max(float(o.sum(m_BT)), 1.0))
  elif aggregation == 'seq_mean_token_mean':
    value = o.sum(o.sum(x_BT * m_BT, 1) / o.maximum(o.sum(m_BT, 1), o.full(m_BT[:, 0], 1.0))) / rows
  elif aggregation == 'seq_mean_token_sum':
    value = total / rows
  elif aggregation == 'seq_mean_token_sum_norm':
    value = total / (rows * (norm_length or T))
  else:
    raise ValueError(f'aggregation={aggregation!r} is not valid')
  return value * dp_size


# ---------------------------------------------------------------------------------------------
# Per-token objectives (to maximise).
# ---------------------------------------------------------------------------------------------


def _ppo(o, r_BT, a_B1, eps_low, eps_high, dual_clip_c):
  obj = o.minimum(r_BT * a_B1, o.clip(r_BT, 1.0 - eps_low, 1.0 + eps_high) * a_B1)
  if dual_clip_c is not None:
    obj = o.where(a_B1 < 0, o.maximum(obj, dual_clip_c * a_B1), obj)
  return obj


def _post_clip(o, s, a, lo, hi):
  """s_bar (Eq. 47): min(s, clip(s)) for A >= 0, max(s, clip(s)) for A < 0."""
  c = o.clip(s, 1.0 - lo, 1.0 + hi)
  return o.where(a >= 0, o.minimum(s, c), o.maximum(s, c))


def _transform(o, name, w_MG, a_MG, trunc_eps):
  """DFPO's in-group transforms (Eq. 50, 18, 51, 52-55) on [M, G] weights."""
  if name == 'min_replace':
    return o.amin(w_MG, 1)[:, None] + 0.0 * w_MG
  if name == 'orth_proj':
    return w_MG - o.safe_div(o.sum(a_MG * w_MG, 1), o.sum(a_MG * a_MG, 1))[:, None] * a_MG
  if name == 'truncate_rebalance':
    s = o.maximum(w_MG, o.full(w_MG, trunc_eps))
    pos, neg = a_MG > 0, a_MG < 0
    p = o.sum(o.where(pos, a_MG * s, 0.0 * s), 1)[:, None]
    n = o.sum(o.where(neg, -a_MG * s, 0.0 * s), 1)[:, None]
    scale = o.where(p > n, o.where(pos, o.safe_div(n, p), 1.0 + 0.0 * s),
                    o.where(p < n, o.where(neg, o.safe_div(p, n), 1.0 + 0.0 * s), 1.0 + 0.0 * s))
    return scale * s
  # 'qp': v = max(w - lam A, 0) with A.v = 0; lam from the bracketing breakpoints (Eq. 51).
  nz = a_MG != 0
  b = o.where(nz, w_MG / o.where(nz, a_MG, 1.0 + 0.0 * a_MG), 0.0 * w_MG)  # breakpoints [M, G]
  f = o.sum(a_MG[:, None, :] *
            o.maximum(w_MG[:, None, :] - b[:, :, None] * a_MG[:, None, :], 0.0 * w_MG[:, None, :]),
            2)  # f at each breakpoint
  lo = o.amax(o.where(nz & (f >= 0), b, o.full(b, -math.inf)), 1)
  hi = o.amin(o.where(nz & (f <= 0), b, o.full(b, math.inf)), 1)
  both = o.amax((a_MG > 0) * 1.0, 1) * o.amax((a_MG < 0) * 1.0, 1) > 0
  lo, hi = o.where(both, lo, 0.0 * lo), o.where(both, hi, 0.0 * hi)
  active = (w_MG - (0.5 * (lo + hi))[:, None] * a_MG) > 0
  num = o.sum(o.where(active, a_MG * w_MG, 0.0 * w_MG), 1)
  den = o.sum(o.where(active, a_MG * a_MG, 0.0 * w_MG), 1)
  lam = o.where(den > 0, num / o.where(den > 0, den, 1.0 + 0.0 * den), lo)
  v = o.maximum(w_MG - lam[:, None] * a_MG, 0.0 * w_MG)
  return o.where(both[:, None], v, o.where(nz, 0.0 * w_MG, w_MG))


def _objective(o, name, log_r_BT, a_B, m_BT, token_weights, group_size, hp):
  r = o.exp(log_r_BT)
  a1 = a_B[:, None]
  if name in ('grpo', 'dapo', 'dr_grpo', 'delta'):
    obj = _ppo(o, r, a1, hp['eps_low'], hp['eps_high'], hp.get('dual_clip_c'))
    return obj * o.sg(token_weights) * m_BT if name == 'delta' else obj
  if name == 'grpo_fix':
    return o.clip(r, 0.0, 1.0 + hp['eps_high']) * a1
  if name == 'cispo':
    weight = o.sg(o.clip(r, 1.0 - hp['eps_low'], 1.0 + hp['eps_high']))
    return weight * a1 * o.exp(log_r_BT - o.sg(log_r_BT))
  if name == 'sapo':
    tau = o.where(a1 > 0, hp['tau_pos'] + 0.0 * a1, hp['tau_neg'] + 0.0 * a1)
    return (4.0 / tau) * o.sigmoid(tau * (r - 1.0)) * a1
  eps = hp.get('eps')
  lo, hi = (eps, eps) if eps is not None else (hp['eps_low'], hp['eps_high'])
  l_B = o.sum(log_r_BT * m_BT, 1) / o.maximum(o.sum(m_BT, 1), o.full(a_B, 1.0))
  if name == 'gspo_token':
    s = o.exp(o.sg(l_B))[:, None] * o.exp(log_r_BT - o.sg(log_r_BT))
    return a1 * _post_clip(o, s, a1 + 0.0 * s, lo, hi)
  s_bar = _post_clip(o, o.exp(l_B), a_B, lo, hi)
  if name == 'gspo':
    return (a_B * s_bar)[:, None] * m_BT
  # DFPO (Eq. 68/85): s_tilde per group, then the gradient reading of clip_gating.
  if hp.get('global_scale') is not None:
    s_tilde = hp['global_scale'] * s_bar
  else:
    kind = name[len('dfpo_'):]
    kind = hp.get('solver', 'qp') if kind == 'pos_orth_proj' else kind
    G = group_size
    s_tilde = _transform(o, kind, s_bar.reshape(-1, G), a_B.reshape(-1, G),
                         hp.get('trunc_eps', 1e-3)).reshape(-1)
  if not hp.get('stop_gradient', True):
    return (a_B * s_tilde)[:, None] * m_BT
  s_tilde = o.sg(s_tilde)
  if hp.get('clip_gating', 'none') == 'gspo':
    phi = o.sg(
        o.where(s_bar > 0, s_tilde / o.where(s_bar > 0, s_bar, 1.0 + 0.0 * s_bar), 0.0 * s_bar))
    return (a_B * phi * s_bar)[:, None] * m_BT
  return (a_B * s_tilde * o.exp(l_B - o.sg(l_B)))[:, None] * m_BT


def loss(name, logp, old_logp, advantages, mask, *, aggregation, group_size=None, num_tokens=None,
         num_sequences=None, dp_size=1, norm_length=None, token_weights=None, **hparams):
  """jtc objective ``name`` as a plain loss (module docstring); ``hparams`` as
  `jtc.objectives.default_hparams(name)` (the defaults fill what is not given)."""
  from jtc import objectives  # pylint: disable=import-outside-toplevel
  hp = {**objectives.LOSSES[name].defaults, **hparams}
  o = _Ops(logp)
  m_BT = mask * 1.0
  log_r_BT = o.where(m_BT > 0, logp - old_logp, 0.0 * logp)
  obj_BT = _objective(o, name, log_r_BT, advantages, m_BT, token_weights, group_size, hp)
  return -aggregate(o, obj_BT, m_BT, aggregation, num_tokens=num_tokens,
                    num_sequences=num_sequences, dp_size=dp_size, norm_length=norm_length)


def _named(name):

  def fn(logp, old_logp, advantages, mask, **kwargs):
    return loss(name, logp, old_logp, advantages, mask, **kwargs)

  fn.__name__ = fn.__qualname__ = name
  fn.__doc__ = f'jtc\'s {name!r} as a plain loss (`loss`).'
  return fn


# One function per objective: `jtc conform --loss jtc.interop.plain_losses:<objective>`.
grpo, dapo, dr_grpo, grpo_fix, cispo, sapo, delta = map(
    _named, ('grpo', 'dapo', 'dr_grpo', 'grpo_fix', 'cispo', 'sapo', 'delta'))
gspo, gspo_token, dfpo_min_replace, dfpo_orth_proj, dfpo_pos_orth_proj = map(
    _named, ('gspo', 'gspo_token', 'dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj'))
