"""Per-step diagnostics of intra-group cancellation and learning tax (paper 2604.13088).

Pure, jit-able functions that measure the mechanisms the paper's claims are about (cited
"Eq. N"); the trainer logs `step_diagnostics` every `log.diagnostics_every` steps. Offline
analysis of a policy (KL drift, drift between equivalent solutions) is in `jtc.analysis.probes`;
statistics of logged curves (Jitter2, Compute@threshold) in `jtc.analysis.curves`.

  asym                     Var_i(w_i A_i) per group (Eq. 23) and its mean (`objectives.asym`).
  loss_coefficients        c_{b,t} = d loss / d log pi(y_{b,t} | h_{b,t}) by `jax.grad` of
                           `objectives.compute_loss` w.r.t. the log-probs. Because a loss
                           depends on theta only through the log-probs, its gradient is exactly
                           sum_{b,t} c_{b,t} grad_theta log pi_{b,t}; the per-token gradient of
                           Eq. 24 is grad l_{b,t} = c_{b,t} grad log pi_{b,t}.
  grad_norms               ||grad_theta log pi_{b,t}||: 'exact' (a Jacobian row per token, small
                           models) or 'proxy' (the LM-head gradient norm, any size), in
                           `jtc.analysis.grad_norms`.
  energy_by_frequency      Energy(B) of Eq. 24 over token-frequency buckets.
  shared_context_mask      the event E_t* of Prop. 3.1: every trajectory of a group has the same
                           prefix (prompt and completion up to t) and the same token at t.
  shared_token_residual    how much of the gradient on such positions survives cancellation.
  net_gradient / position_net_grad_norms   exact net gradient vectors (one VJP) for notebooks.
  step_diagnostics         the scalars the trainer logs, measured at an off-policy mini-batch.

Dimension key (docs/dimensions.md):
  B batch of completions (B = M * G, groups contiguous), M groups, G group size,
  T completion length, L = P + T full sequence length, P prompt width, D model dim,
  V vocab, O frequency buckets, U = B * T flattened tokens.
"""

import chex
import jax
import jax.numpy as jnp

from jtc import checks
from jtc.analysis import grad_norms
from jtc.analysis import gradient_mass
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc import objectives

# ---------------------------------------------------------------------------------------------
# Per-token coefficients (their gradient norms: `jtc.analysis.grad_norms`).
# ---------------------------------------------------------------------------------------------


def loss_coefficients(logps_BT, *, loss_name, old_logps, advantages, mask, group_size,
                      ref_logps=None, token_weights=None, **hparams):
  """c_BT = d loss / d logps_BT (jax.grad of `objectives.compute_loss`) and the loss metrics.

  The loss depends on theta only through logps (``entropy_coef`` must be 0: the entropy bonus
  would add a term outside this factorisation), so
    grad_theta loss = sum_{b,t} c_{b,t} grad_theta log pi_theta(y_{b,t} | h_{b,t})
  exactly, and grad l_{b,t} = c_{b,t} grad log pi_{b,t} is the per-token gradient of Eq. 24.
  Under GRPO inside the clip range c_{b,t} = -r A_b * (aggregation weight); under GSPO it is
  -s_b A_b / |y_b| (per-sequence weights: Corollary 3.3).
  """
  if hparams.get('entropy_coef', 0.0) != 0.0:
    raise ValueError(f'entropy_coef={hparams["entropy_coef"]!r}: diagnostics need entropy_coef=0 '
                     '(the entropy bonus is not a function of the sampled-token log-probs)')

  def loss_fn(lp_BT):
    return objectives.compute_loss(loss_name, logps=lp_BT, old_logps=old_logps,
                                   advantages=advantages, mask=mask, group_size=group_size,
                                   ref_logps=ref_logps, token_weights=token_weights, **hparams)

  coef_BT, metrics = jax.grad(loss_fn, has_aux=True)(jnp.asarray(logps_BT, jnp.float32))
  return coef_BT * (jnp.asarray(mask) > 0), metrics


# ---------------------------------------------------------------------------------------------
# Token frequency and Energy (Eq. 24).
# ---------------------------------------------------------------------------------------------


def update_token_counts(counts_V, token_ids_BT, mask_BT):
  """counts_V plus the occurrences of every real token of the batch (jit-able)."""
  chex.assert_rank([counts_V, token_ids_BT, mask_BT], [1, 2, 2])
  chex.assert_equal_shape([token_ids_BT, mask_BT])
  return counts_V.at[token_ids_BT.reshape(-1)].add((jnp.asarray(mask_BT)
                                                    > 0).reshape(-1).astype(counts_V.dtype))


def token_frequency_buckets(token_ids_BT, mask_BT, counts_V, *, num_buckets=3):
  """Bucket of every token by vocabulary frequency; 0 = the most frequent ids. [B, T] int32.

  Ids are sorted by count (descending) and bucket k holds the ids whose cumulative share of all
  counted occurrences lies in [k / O, (k + 1) / O): bucket 0 is the few ids that make up the
  first 1/O of the text (templates, digits, spaces), bucket O-1 the long tail. An id's bucket
  is that of the start of its mass interval, so one very frequent id can leave a bucket empty.
  Padding (mask 0) gets bucket O-1; it is excluded from every Energy sum by the mask anyway.
  """
  chex.assert_rank([token_ids_BT, mask_BT, counts_V], [2, 2, 1])
  chex.assert_equal_shape([token_ids_BT, mask_BT])
  if not isinstance(num_buckets, int) or num_buckets < 1:
    raise ValueError(f'num_buckets={num_buckets!r} must be a positive int')
  counts_V = jnp.asarray(counts_V, jnp.float32)
  order_V = jnp.argsort(-counts_V, stable=True)
  sorted_V = counts_V[order_V]
  start_V = (jnp.cumsum(sorted_V) - sorted_V) / jnp.maximum(jnp.sum(sorted_V), 1.0)
  bucket_sorted_V = jnp.clip(jnp.floor(start_V * num_buckets), 0, num_buckets - 1)
  bucket_V = jnp.zeros_like(order_V).at[order_V].set(bucket_sorted_V.astype(order_V.dtype))
  bucket_BT = bucket_V[token_ids_BT].astype(jnp.int32)
  return jnp.where(jnp.asarray(mask_BT) > 0, bucket_BT, num_buckets - 1)


def energy_by_frequency(token_grad_norms_BT, bucket_BT, mask_BT, *, num_buckets):
  """Energy(B_k) = sum_{t in B_k} ||grad l_t|| / sum_t ||grad l_t|| (paper Eq. 24). [O].

  Args:
    token_grad_norms_BT: [B, T] per-token gradient norms ||grad l_t|| = |c_t| ||grad log pi_t||.
    bucket_BT: [B, T] int bucket of each token (`token_frequency_buckets`).
    mask_BT: [B, T] real tokens.
  Returns:
    [O] shares; they sum to 1 (all zero if every real token has zero gradient).
  """
  chex.assert_rank([token_grad_norms_BT, bucket_BT, mask_BT], 2)
  chex.assert_equal_shape([token_grad_norms_BT, bucket_BT, mask_BT])
  x_U = (token_grad_norms_BT * (jnp.asarray(mask_BT) > 0)).reshape(-1).astype(jnp.float32)
  per_bucket_O = jax.ops.segment_sum(x_U, bucket_BT.reshape(-1), num_segments=num_buckets)
  total = jnp.sum(x_U)
  return per_bucket_O / jnp.where(total > 0, total, 1.0)


# ---------------------------------------------------------------------------------------------
# Shared (context, token) positions and their cancellation residual.
# ---------------------------------------------------------------------------------------------


def shared_context_mask(tokens_BL, input_mask_BL, mask_BT, *, group_size, completion_start):
  """[B, T] bool: position t of row b is an event E_t of Prop. 3.1 -- every member of b's
  group is a real token at t with the same prompt, the same completion prefix y_{<t} and the
  same token y_t. Such positions have the same context h and token y, hence identical
  grad log pi, and their net gradient is (sum_i c_{i,t}) grad log pi(y | h).

  Only whole-group sharing counts: group-relative advantages sum to 0 over the whole group, so
  only there can an exchangeable objective cancel exactly.
  """
  chex.assert_rank([tokens_BL, input_mask_BL, mask_BT], 2)
  chex.assert_equal_shape([tokens_BL, input_mask_BL])
  B, L = tokens_BL.shape
  P = completion_start
  checks.group_size(group_size, B)
  if mask_BT.shape != (B, L - P):
    raise ValueError(f'mask shape {mask_BT.shape} != (B, L - completion_start) = {(B, L - P)}')
  tok_MGL = tokens_BL.reshape(-1, group_size, L)
  inm_MGL = jnp.asarray(input_mask_BL).reshape(-1, group_size, L) > 0
  same_ML = jnp.all((tok_MGL == tok_MGL[:, :1]) & (inm_MGL == inm_MGL[:, :1]), axis=1)
  prompt_ok_M = jnp.all(same_ML[:, :P], axis=-1)
  real_MT = jnp.all(jnp.asarray(mask_BT).reshape(-1, group_size, L - P) > 0, axis=1)
  shared_MT = jnp.cumprod(same_ML[:, P:] & real_MT, axis=-1).astype(bool)
  shared_MT = shared_MT & prompt_ok_M[:, None]
  return jnp.repeat(shared_MT, group_size, axis=0)


def shared_token_residual(coef_BT, grad_norms_BT, shared_BT, mask_BT, *, group_size):
  """Cancellation residual on shared (context, token) positions (Prop. 3.1, Eq. 2).

  On an event E_t (``shared_BT``) all G members have the same grad log pi =: g_t, so the net
  gradient there is exactly (sum_i c_{i,t}) g_t and its norm |sum_i c_{i,t}| ||g_t||; only
  the norm ||g_t|| (``grad_norms_BT``, exact or proxy) is needed. Reported (Eq. 24 units):

    residual     = sum_t |sum_i c_it| ||g_t|| / sum_t sum_i |c_it| ||g_t||   in [0, 1]:
                   0 = the group's updates on shared tokens cancel (Eq. 2), 1 = none cancels.
    net_share    = sum_t |sum_i c_it| ||g_t|| / sum_{all real (b,t)} |c_bt| ||grad log pi_bt||:
                   net shared-token gradient relative to the total per-token gradient mass.
    shared_energy= the same denominator's share that sits on shared positions (before
                   cancellation); shared_frac = fraction of real tokens that are shared.

  Sums over different events add norms (the triangle inequality upper bound of the norm of
  their vector sum); `net_gradient` gives the exact vector if needed.
  """
  chex.assert_rank([coef_BT, grad_norms_BT, shared_BT, mask_BT], 2)
  chex.assert_equal_shape([coef_BT, grad_norms_BT, shared_BT, mask_BT])
  checks.group_size(group_size, coef_BT.shape[0])
  real_BT = jnp.asarray(mask_BT) > 0
  sh_BT = jnp.asarray(shared_BT).astype(bool) & real_BT
  T = coef_BT.shape[1]
  c_MGT = jnp.where(sh_BT, coef_BT, 0.0).reshape(-1, group_size, T)
  n_MGT = jnp.where(sh_BT, grad_norms_BT, 0.0).reshape(-1, group_size, T)
  g_MT = jnp.mean(n_MGT, axis=1)  # members of an event share g_t; mean removes float noise
  net = jnp.sum(jnp.abs(jnp.sum(c_MGT, axis=1)) * g_MT)
  gross_shared = jnp.sum(jnp.abs(c_MGT) * n_MGT)
  gross_all = jnp.sum(jnp.where(real_BT, jnp.abs(coef_BT) * grad_norms_BT, 0.0))
  safe = lambda d: jnp.where(d > 0, d, 1.0)
  return {
      'residual': net / safe(gross_shared),
      'net_share': net / safe(gross_all),
      'shared_energy': gross_shared / safe(gross_all),
      'shared_frac': jnp.sum(sh_BT) / jnp.maximum(jnp.sum(real_BT), 1),
  }


def net_gradient(params, config, tokens_BL, input_mask_BL, weights_BT, *, completion_start):
  """grad_theta sum_{b,t} w_{b,t} log pi(y_{b,t} | h_{b,t}) with w held constant: one VJP.

  With w = c * select this is the exact net gradient vector of the selected per-token terms.
  """
  chex.assert_rank([tokens_BL, input_mask_BL, weights_BT], 2)
  # The weights are coefficients of the score vectors (Eq. 1's A_i grad omega): constants.
  weights_BT = jax.lax.stop_gradient(weights_BT)

  def fn(p):
    logps_BT = logprobs.sequence_logprobs(p, config, tokens_BL, input_mask_BL,
                                          completion_start=completion_start)['logps']
    return jnp.sum(logps_BT * weights_BT)

  return jax.grad(fn)(params)


def position_net_grad_norms(params, config, tokens_BL, input_mask_BL, coef_BT, *, completion_start):
  """[T] exact || sum_b c_{b,t} grad log pi_{b,t} ||: the net gradient of each completion
  position over the given rows (pass one group). One `net_gradient` (a backward pass) per
  position, in sequence (`jax.lax.map`)."""
  chex.assert_rank([tokens_BL, input_mask_BL, coef_BT], 2)
  T = coef_BT.shape[1]

  def one(t):
    weights_BT = coef_BT * (jnp.arange(T) == t)[None, :]
    grads = net_gradient(params, config, tokens_BL, input_mask_BL, weights_BT,
                         completion_start=completion_start)
    return jnp.sqrt(
        sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(grads)))

  return jax.lax.map(one, jnp.arange(T))


# ---------------------------------------------------------------------------------------------
# What the trainer logs.
# ---------------------------------------------------------------------------------------------


def step_diagnostics(params, model_config, batch, *, loss_name, loss_hparams, group_size,
                     completion_start, token_counts=None, mode='proxy', num_buckets=3):
  """Scalars the trainer logs every ``diagnostics_every`` steps (jit with everything but
  ``params``, ``batch`` and ``token_counts`` static, e.g. via functools.partial).

  Args:
    params, model_config: the current policy.
    batch: an `update.Batch` (tokens_BL, input_mask_BL, mask_BT, advantages_B, old_logps_BT,
      optional ref_logps_BT, token_weights_BT and is_weights_BT).
    loss_name, loss_hparams: as for `objectives.compute_loss` (entropy_coef is ignored: the
      diagnostics are about the policy-gradient (+ KL) term).
    group_size, completion_start: G and P.
    token_counts: [V] token occurrence counts for the frequency buckets (e.g. accumulated with
      `update_token_counts`); None = the counts of this batch.
    mode: 'proxy' (default; LM-head gradient norms) or 'exact' (all-parameter per-token
      gradient norms; small models only).
    num_buckets: O frequency buckets; bucket 0 is the high-frequency one.

  Where to call it: with the parameters about to be updated on ``batch`` (the trainer measures
  every mini-batch after the first of a step). On the rollout batch before any update the
  parameters ARE the behaviour policy: every ratio is 1, every DFPO transform the identity,
  GRPO-fix equals GRPO, and all methods give identical diagnostics.

  Returns dict of float32 scalars: 'diag/asym', 'diag/asym_gated', 'diag/coef_mass_vs_gspo',
  'diag/frac_traj_gated', 'diag/approx_kl' (from the loss's metrics at this point: how far
  off-policy it is), 'diag/energy_b{k}' (Eq. 24 share of bucket k; b0 = high frequency),
  'diag/shared_residual', 'diag/shared_net_share', 'diag/shared_energy', 'diag/shared_frac'
  (`shared_token_residual`), 'diag/coef_abs_mean', 'diag/mass_sign_balance' and
  'diag/mass_mean_p' (FADE's gradient mass, `gradient_mass`).

  Cost: mode='proxy' is one forward pass of the batch (no backward pass) plus one extra
  chunked LM-head pass and O(B T) work, i.e. about a third of an update step on the same
  batch; at diagnostics_every=10 that is a few percent (benchmarks/diagnostics.py).
  mode='exact' adds B T backward passes (a Jacobian per row): for tiny models and notebooks.
  """
  grad_norms.check_mode(mode)
  hp = dict(loss_hparams)
  hp['entropy_coef'] = 0.0
  tokens_BL, input_mask_BL, mask_BT = batch.tokens_BL, batch.input_mask_BL, batch.mask_BT
  out = logprobs.sequence_logprobs(params, model_config, tokens_BL, input_mask_BL,
                                   completion_start=completion_start, return_hidden=mode == 'proxy')
  coef_BT, metrics = loss_coefficients(out['logps'], loss_name=loss_name,
                                       old_logps=batch.old_logps_BT, advantages=batch.advantages_B,
                                       mask=mask_BT, group_size=group_size,
                                       ref_logps=batch.ref_logps_BT,
                                       token_weights=batch.token_weights_BT,
                                       is_weights=batch.is_weights_BT, **hp)
  targets_BT = tokens_BL[:, completion_start:]
  if mode == 'proxy':
    norms_BT = grad_norms.lm_head_grad_norms(out['hidden'],
                                             model_lib.lm_head_DV(params, model_config), targets_BT)
  else:
    norms_BT = grad_norms.exact_grad_norms(params, model_config, tokens_BL, input_mask_BL,
                                           completion_start=completion_start)
  tok_norms_BT = jnp.abs(coef_BT) * norms_BT
  if token_counts is None:
    token_counts = update_token_counts(jnp.zeros((model_config.vocab_size,), jnp.float32),
                                       targets_BT, mask_BT)
  bucket_BT = token_frequency_buckets(targets_BT, mask_BT, token_counts, num_buckets=num_buckets)
  energy_O = energy_by_frequency(tok_norms_BT, bucket_BT, mask_BT, num_buckets=num_buckets)
  shared_BT = shared_context_mask(tokens_BL, input_mask_BL, mask_BT, group_size=group_size,
                                  completion_start=completion_start)
  res = shared_token_residual(coef_BT, norms_BT, shared_BT, mask_BT, group_size=group_size)
  real_BT = jnp.asarray(mask_BT) > 0
  diag = {
      'diag/asym': metrics['asym'],
      'diag/asym_gated': metrics['asym_gated'],
      'diag/coef_mass_vs_gspo': metrics['coef_mass_vs_gspo'],
      'diag/frac_traj_gated': metrics['frac_traj_gated'],
      'diag/approx_kl': metrics['approx_kl'],
      'diag/coef_abs_mean': jnp.sum(jnp.abs(coef_BT)) / jnp.maximum(jnp.sum(real_BT), 1)
  }
  diag.update({f'diag/energy_b{k}': energy_O[k] for k in range(num_buckets)})
  # FADE's gradient mass (jtc.analysis.gradient_mass): the sign axis and the mass-weighted
  # success rate of the groups (the difficulty axis), from the same coefficients.
  mass = gradient_mass.gradient_mass(coef_BT, mask_BT, batch.advantages_B, group_size=group_size)
  diag.update({
      'diag/mass_sign_balance': mass['sign_balance'],
      'diag/mass_mean_p': mass['mass_mean_p']
  })
  diag.update({
      f'diag/shared_{k}' if not k.startswith('shared') else f'diag/{k}': v for k, v in res.items()
  })
  return {k: jnp.asarray(v, jnp.float32) for k, v in diag.items()}
