"""DelTA's coefficients as a numpy reference, the batches they are checked on, and `run`, which
calls `delta.token_coefficients` jitted (shared by the DelTA tests)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jtc.objectives import delta

B, T, D = 6, 5, 4


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
