"""Token coupling: each token's first-order change of log-probability in one update, split into
its own term and the terms of every other token of the update (the Cancellation Hypothesis,
Cheng et al. 2026, arXiv 2605.08666: a token's change is "not fully determined by its own
advantage; coupled gradient interactions with other tokens also play a non-negligible role ...
primarily between identical tokens that are both predicted with low confidence").

The update. A loss that depends on theta only through the sampled tokens' log-probs has the
gradient g = sum_j c_j g_j, c_j = d loss / d log pi_j (`diagnostics.loss_coefficients`) and
g_j = grad_theta log pi_j. jtc's optimiser (global-norm clip, then AdamW) takes the step

  Delta theta = -D * g + mu,   D = lr_t (1 - b1) s / ((1 - b1^t) (sqrt(v_hat_t) + eps)),
                               mu = -lr_t (b1 m_{t-1} / (1 - b1^t) / (sqrt(v_hat_t) + eps) + wd theta)

exactly (`adam_parts`; s the clip's scale, v_hat_t the second moment after this gradient, *
elementwise): D is the actual update's diagonal preconditioning and mu the part of the step that
is not this batch's gradient (momentum, weight decay). Plain SGD is D = lr, mu = 0 (`sgd_parts`).

The decomposition. To first order, token i's change is
  Delta log pi_i ~ g_i . Delta theta = -c_i g_i^T D g_i              (own)
                                      - sum_{j != i, y_j = y_i} c_j g_i^T D g_j   (same id)
                                      - sum_{j: y_j != y_i} c_j g_i^T D g_j       (other ids)
                                      + g_i . mu                                  (momentum),
and each coupling sum is also split by the other token's confidence pi_j (bins `CONF_EDGES`).
Without a [U, U] Gram matrix: per token id v, one VJP gives H_v = sum_{j: y_j = v} c_j g_j and
one JVP gives g_i^T D H_v for every i at once; the own term g_i^T D g_i needs the per-token
gradients (one Jacobian per row). `gram` builds the explicit D-weighted Gram matrix for small
cases (the known-answer tests).

Dimension key (docs/dimensions.md): B rows, T completion length, U = B * T tokens, O confidence
bins (len(CONF_EDGES) + 1).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jtc.models import logprobs

CONF_EDGES = (0.5,)  # pi_j < 0.5: low confidence, >= 0.5: high (each bin costs a pass per id)
CONF_NAMES = ('low', 'high')


class PolicyLogps:
  """params -> [B, T] log pi of the completion tokens (`logprobs.sequence_logprobs`), and
  ``row(params, i)`` -> [T] of row i alone (the per-token Jacobians then cost one row's
  backward passes, not the batch's). Hashable by identity: the jitted helpers below take it as
  a static argument and compile once per batch."""

  def __init__(self, config, tokens_BL, input_mask_BL, *, completion_start):
    self.config, self.completion_start = config, completion_start
    self.tokens_BL, self.input_mask_BL = tokens_BL, input_mask_BL

  def __call__(self, params):
    return logprobs.sequence_logprobs(params, self.config, self.tokens_BL, self.input_mask_BL,
                                      completion_start=self.completion_start)['logps']

  def row(self, params, i):
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, i, 1, axis=0)
    return logprobs.sequence_logprobs(params, self.config, take(self.tokens_BL),
                                      take(self.input_mask_BL),
                                      completion_start=self.completion_start)['logps'][0]


def policy_logps_fn(config, tokens_BL, input_mask_BL, *, completion_start):
  """A `PolicyLogps` of these rows."""
  return PolicyLogps(config, tokens_BL, input_mask_BL, completion_start=completion_start)


def _adam_state(opt_state):
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  return next(s for s in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(s))


def adam_parts(grads, opt_state, params, *, optim, learning_rate):
  """(D, mu, s) of the update `update.make_optimizer(optim, ...)` takes from ``opt_state`` with
  gradient ``grads`` at peak-scheduled rate ``learning_rate`` (lr_t of this update): -D * grads
  + mu is that update (module docstring; tests check it against optax). D and mu are pytrees
  like ``params``; s is the global-norm clip's scale."""
  adam = _adam_state(opt_state)
  t = adam.count.astype(jnp.float32) + 1.0
  norm = optax.tree.norm(grads)
  s = jnp.where((optim.grad_clip > 0) & (norm > optim.grad_clip),
                optim.grad_clip / jnp.where(norm > 0, norm, 1.0), 1.0)
  b1, b2 = optim.adam_b1, optim.adam_b2
  v_hat = jax.tree.map(lambda v, g: (b2 * v + (1 - b2) * jnp.square(s * g)) / (1 - b2**t), adam.nu,
                       grads)
  denom = jax.tree.map(lambda v: jnp.sqrt(v) + 1e-8, v_hat)  # update.ADAM_EPS
  d = jax.tree.map(lambda q: learning_rate * (1 - b1) * s / ((1 - b1**t) * q), denom)
  mu = jax.tree.map(
      lambda m, q, p: -learning_rate * (b1 * m / (1 - b1**t) / q + optim.weight_decay * p), adam.mu,
      denom, params)
  return d, mu, s


def sgd_parts(params, *, learning_rate):
  """(D, mu, s) of plain SGD: D = lr everywhere, mu = 0, no clip."""
  return (jax.tree.map(lambda p: jnp.full(p.shape, learning_rate, jnp.float32),
                       params), jax.tree.map(jnp.zeros_like, params), 1.0)


def confidence_bins(logps_BT, edges=CONF_EDGES):
  """[B, T] int: the bin of pi = exp(log pi) among [0, e_0), [e_0, e_1), ..., [e_last, 1]."""
  return jnp.searchsorted(jnp.asarray(edges, jnp.float32), jnp.exp(logps_BT),
                          side='right').astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def _weighted_norms(logps_fn, params, d):
  """[B, T] g_i^T D g_i: one reverse-mode Jacobian per row (rows in sequence), of the row alone
  when ``logps_fn`` has a ``row(params, i)`` (`PolicyLogps`), else of the batch's row i."""
  b = jax.eval_shape(logps_fn, params).shape[0]
  row_fn = getattr(logps_fn, 'row', None) or (lambda p, i: logps_fn(p)[i])

  def row(i):
    jac = jax.jacrev(lambda p: row_fn(p, i))(params)
    return sum(
        jnp.sum((dd[None] * jnp.square(j)).reshape(j.shape[0], -1), axis=-1)
        for j, dd in zip(jax.tree.leaves(jac), jax.tree.leaves(d)))

  return jax.lax.map(row, jnp.arange(b))


CHUNK = 8  # weight vectors per vectorised VJP + JVP in `_coupled_many`


@functools.partial(jax.jit, static_argnums=0)
def _coupled_many(logps_fn, params, d, w_nCBT):
  """[n, C, B, T]: g_i^T D (sum_j w_j g_j) for every token i and every weight array w: one
  forward pass, then one VJP and one JVP per w, C of them vectorised at a time."""
  _, vjp = jax.vjp(logps_fn, params)

  def one(w_BT):
    h, = vjp(w_BT.astype(jnp.float32))
    tangent = jax.tree.map(lambda a, b: (a * b).astype(b.dtype), d, h)
    return jax.jvp(logps_fn, (params,), (tangent,))[1]

  return jax.lax.map(jax.vmap(one), w_nCBT)


def _coupled(logps_fn, params, d, w_NBT):
  """`_coupled_many` of N weight arrays [N, B, T] (padded to chunks of CHUNK)."""
  n = w_NBT.shape[0]
  pad = -n % CHUNK
  w = jnp.concatenate([w_NBT, jnp.zeros((pad,) + w_NBT.shape[1:], w_NBT.dtype)])
  out = _coupled_many(logps_fn, params, d, w.reshape((-1, CHUNK) + w_NBT.shape[1:]))
  return out.reshape((-1,) + w_NBT.shape[1:])[:n]


@functools.partial(jax.jit, static_argnums=0)
def _directional(logps_fn, params, tangent):
  """g_i . tangent for every token i: one JVP."""
  return jax.jvp(logps_fn, (params,), (tangent,))[1]


def decompose(logps_fn, params, coef_BT, mask_BT, ids_BT, *, d, mu=None, edges=CONF_EDGES):
  """Each real token's first-order change split into own / same-id / other-id / momentum terms
  (module docstring), the coupling terms also by the other token's confidence bin.

  Args:
    logps_fn: params -> [B, T] log-probs of the update's tokens (`policy_logps_fn`).
    params: the parameters before the update.
    coef_BT: [B, T] c = d loss / d log pi (0 on padding).
    mask_BT: [B, T] real tokens.
    ids_BT: [B, T] token ids (concrete: the ids present are enumerated on the host).
    d, mu: the update's preconditioning and the rest of its step (`adam_parts`, `sgd_parts`);
      mu None = 0.
    edges: confidence bin edges of the other token's pi.
  Returns:
    dict of float32 [B, T] arrays (0 on padding): 'own', 'same', 'other', 'momentum',
    'first_order' (their sum), 'norm' (g_i^T D g_i), 'conf_bin'; and [O, B, T] arrays
    'same_by_conf', 'other_by_conf' (summing over O to 'same' / 'other').
  """
  chex.assert_rank([coef_BT, mask_BT, ids_BT], 2)
  chex.assert_equal_shape([coef_BT, mask_BT, ids_BT])
  real_BT = jnp.asarray(mask_BT) > 0
  c_BT = jnp.where(real_BT, jnp.asarray(coef_BT, jnp.float32), 0.0)
  ids_BT = np.asarray(ids_BT)
  bin_BT = confidence_bins(jax.jit(logps_fn)(params), edges)
  k = len(edges) + 1
  norm_BT = _weighted_norms(logps_fn, params, d)
  own_BT = -c_BT * norm_BT
  present = np.unique(ids_BT[np.asarray(real_BT)])
  same_id_VBT = jnp.asarray(ids_BT[None] == present[:, None, None])
  in_bin_OBT = bin_BT[None] == jnp.arange(k)[:, None, None]
  # Per bin: the weights of every token of the bin, then of its tokens of each id present.
  w = jnp.concatenate([(c_BT * in_bin_OBT)[:, None],
                       (c_BT * in_bin_OBT)[:, None] * same_id_VBT[None]],
                      axis=1)  # [O, 1 + ids, B, T]
  g = _coupled(logps_fn, params, d, w.reshape((-1,) + c_BT.shape)).reshape(w.shape)
  same_O, other_O = [], []
  for b in range(k):
    total_BT = g[b, 0]
    same_BT = jnp.sum(jnp.where(same_id_VBT, g[b, 1:], 0.0), axis=0)  # token i's own id's entry
    self_BT = jnp.where(in_bin_OBT[b], c_BT * norm_BT, 0.0)  # the token's own term, in its bin
    same_O.append(-(same_BT - self_BT))
    other_O.append(-(total_BT - same_BT))
  momentum_BT = jnp.zeros_like(own_BT) if mu is None else _directional(logps_fn, params, mu)
  zero = lambda x: jnp.where(real_BT, x, 0.0)
  same_OBT, other_OBT = zero(jnp.stack(same_O)), zero(jnp.stack(other_O))
  out = {
      'own': zero(own_BT),
      'same': jnp.sum(same_OBT, axis=0),
      'other': jnp.sum(other_OBT, axis=0),
      'momentum': zero(momentum_BT),
      'norm': zero(norm_BT),
      'conf_bin': bin_BT,
      'same_by_conf': same_OBT,
      'other_by_conf': other_OBT,
  }
  out['first_order'] = out['own'] + out['same'] + out['other'] + out['momentum']
  return out


def gram(logps_fn, params, mask_BT, *, d):
  """[U, U] K_ij = g_i^T D g_j over the real tokens, in row-major (b, t) order, and their [U]
  flat indices: the explicit form of what `decompose` sums (small cases only)."""
  jac = jax.jacrev(logps_fn)(params)
  flat = np.flatnonzero(np.asarray(mask_BT).reshape(-1) > 0)
  rows = [(jnp.sqrt(dd).reshape(-1)[None] * j.reshape(-1, dd.size))[flat]
          for j, dd in zip(jax.tree.leaves(jac), jax.tree.leaves(d))]
  j_UP = jnp.concatenate(rows, axis=1)
  return j_UP @ j_UP.T, flat


def contested_mask(ids_BT, mask_BT, adv_B, *, group_size):
  """[B, T] bool: real tokens whose id occurs, within their group, both in a positive- and in a
  negative-advantage rollout: the "tokens shared by positive and negative rollouts" on which the
  Cancellation Hypothesis says opposing signals cancel."""
  chex.assert_rank([ids_BT, mask_BT, adv_B], [2, 2, 1])
  b, _ = ids_BT.shape
  ids_BT, real_BT, adv_B = np.asarray(ids_BT), np.asarray(mask_BT) > 0, np.asarray(adv_B)
  out = np.zeros(ids_BT.shape, bool)
  for start in range(0, b, group_size):
    rows = slice(start, start + group_size)
    ids, real, adv = ids_BT[rows], real_BT[rows], adv_B[rows]
    pos = set(ids[(adv > 0)[:, None] & real].tolist())
    neg = set(ids[(adv < 0)[:, None] & real].tolist())
    out[rows] = real & np.isin(ids, list(pos & neg))
  return out


def summarize(parts, mask_BT, *, contested_BT=None, exact_BT=None):
  """Scalars of `decompose`'s output over the real tokens: mean |term| of each term; the
  same-id share of the coupling (sum |same| / (sum |same| + sum |other|)), the low-confidence
  share of the same-id coupling and of the tokens; the coupling's size against the own term
  (sum |same + other| / sum |own|); on the contested tokens (`contested_mask`) the cancellation
  residual sum |own + same| / (sum |own| + sum |same|) (0: the same-id coupling cancels the own
  term, 1: it adds to it); against the exact change (``exact_BT``, `flipping.rescore`) the
  relative error of the first-order sum and the share of tokens whose sign it gets right (also
  weighted by the size of the exact change)."""
  real = np.asarray(mask_BT) > 0
  a = {k: np.abs(np.asarray(parts[k]))[real] for k in ('own', 'same', 'other', 'momentum')}
  safe = lambda x: x if x > 0 else np.nan
  out = {f'{k}_abs_mean': float(v.mean()) if v.size else np.nan for k, v in a.items()}
  out['same_share_of_coupling'] = float(a['same'].sum() / safe(a['same'].sum() + a['other'].sum()))
  same_O = np.abs(np.asarray(parts['same_by_conf']))[:, real].sum(-1)
  out['same_low_conf_share'] = float(same_O[0] / safe(same_O.sum()))
  out['low_conf_token_share'] = float(np.mean(np.asarray(parts['conf_bin'])[real] == 0))
  out['coupling_to_own'] = float(
      np.abs(np.asarray(parts['same'] + parts['other'])[real]).sum() / safe(a['own'].sum()))
  if contested_BT is not None:
    sel = real & np.asarray(contested_BT)
    own, same = np.asarray(parts['own'])[sel], np.asarray(parts['same'])[sel]
    out['contested_frac'] = float(sel.sum() / max(real.sum(), 1))
    out['contested_residual'] = float(
        np.abs(own + same).sum() / safe(np.abs(own).sum() + np.abs(same).sum()))
  if exact_BT is not None:
    first, exact = np.asarray(parts['first_order'])[real], np.asarray(exact_BT)[real]
    out['first_order_rel_error'] = float(np.abs(first - exact).sum() / safe(np.abs(exact).sum()))
    agree = np.sign(first) == np.sign(exact)
    out['first_order_sign_agreement'] = float(np.mean(agree))
    # Weighted by |exact change|: the tokens that barely moved decide little.
    out['first_order_sign_agreement_weighted'] = float(
        np.abs(exact)[agree].sum() / safe(np.abs(exact).sum()))
  return out
