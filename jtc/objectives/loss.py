"""Intra-group RL objectives on per-token log-probs: one entry point, ``compute_loss``.

Dimension key (docs/dimensions.md):
  B  batch of completions, B = M * G, each group of G completions contiguous
  M  number of groups (prompts)
  G  group size
  T  completion length (padded; ``mask_BT`` marks real tokens)

Notation (paper 2604.13088, cited "Eq. N"): r_{i,t} = pi_theta / pi_old of token t of
completion i (Eq. 7); s_i = exp(mean_t log r_{i,t}) the length-normalised sequence ratio
(Eq. 44); A_i the group-relative advantage. Every loss (`jtc.objectives.surrogates`, registered in
``LOSSES``: `jtc.objectives.registry`) builds a
per-token *objective* ``obj_BT`` (to be maximised); ``loss = -aggregate(obj_BT) + kl_coef *
aggregate(kl_BT) - entropy_coef * aggregate(entropy_BT)`` is minimised. The gradient flows only through
``logps``; ``old_logps``, ``ref_logps``, ``advantages`` and ``token_weights`` are constants.

The losses, their hyper-parameters (``default_hparams(name)``) and DFPO's two readings of
GSPO's clip are documented in `jtc.objectives.surrogates`.

Aggregations (``AGGREGATIONS``; x_BT masked by mask_BT, |y_b| = sum_t mask_bt):
  token_mean               sum_bt x / sum_bt mask                 (DAPO)
  seq_mean_token_mean      mean_b (sum_t x / |y_b|)                (GRPO, GSPO)
  seq_mean_token_sum       mean_b sum_t x
  seq_mean_token_sum_norm  sum_bt x / (B * T)                      (Dr. GRPO, constant T)
Sequence-level losses (gspo, dfpo_*) put their per-completion value on every real token, so the
same aggregations apply: seq_mean_token_mean weighs completions equally, token_mean by length.
Fully masked completions contribute 0 (and still count in B for the seq_* modes).

Metrics (flat dict of float32 scalars): pg_loss, clip_frac_low, clip_frac_high (fraction of
real tokens whose gradient or weight is clipped from below / above), ratio_mean/min/max (token
ratio r over real tokens), seq_ratio_mean/min/max (s_i), approx_kl (k3 estimate of
KL(pi_old || pi_theta) per token), asym (Eq. 23 with Eq. 14's weights w_i: s_i for GSPO,
s_tilde_i for DFPO, the token-mean ratio for token losses; see `asym`: on-policy it is the mean
Var(A) whatever the method), asym_gated (the same with w_i = 0 where the clip switches the
gradient off), coef_mass / coef_mass_vs_gspo / frac_traj_gated (the effective step: total
|d pg_loss / d log pi| and its ratio to GSPO's on the same inputs, and the fraction of live
trajectories whose gradient is switched off), frac_degenerate_groups (groups whose advantages
are all equal); plus kl (when ref_logps is given) and entropy (when entropy is given: the
per-token mean policy entropy over real tokens, whatever the aggregation).
"""

import functools

import chex
import jax
import jax.numpy as jnp

from jtc import checks
from jtc.objectives import registry
from jtc.objectives import surrogates  # registers the built-in losses
from jtc.objectives.registry import LOSSES, LossInputs

# ---------------------------------------------------------------------------------------------
# Aggregations, KL estimators.
# ---------------------------------------------------------------------------------------------


def token_mean(x_BT, mask_BT):
  """sum_bt x m / sum_bt m (DAPO)."""
  chex.assert_equal_shape([x_BT, mask_BT])
  return jnp.sum(x_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)


def seq_mean_token_mean(x_BT, mask_BT):
  """mean_b (sum_t x m / |y_b|) (GRPO, GSPO)."""
  chex.assert_equal_shape([x_BT, mask_BT])
  return jnp.mean(surrogates.masked_mean_t(x_BT, mask_BT))


def seq_mean_token_sum(x_BT, mask_BT):
  """mean_b sum_t x m."""
  chex.assert_equal_shape([x_BT, mask_BT])
  return jnp.mean(jnp.sum(x_BT * mask_BT, axis=-1))


def seq_mean_token_sum_norm(x_BT, mask_BT):
  """sum_bt x m / (B T): sequence sums over a constant length T (Dr. GRPO)."""
  chex.assert_equal_shape([x_BT, mask_BT])
  return jnp.sum(x_BT * mask_BT) / (x_BT.shape[0] * x_BT.shape[1])


AGGREGATIONS = {
    'token_mean': token_mean,
    'seq_mean_token_mean': seq_mean_token_mean,
    'seq_mean_token_sum': seq_mean_token_sum,
    'seq_mean_token_sum_norm': seq_mean_token_sum_norm,
}


def kl_k1(logps_BT, ref_logps_BT):
  """k1 = log pi - log pi_ref (Schulman 2020)."""
  return logps_BT - ref_logps_BT


def kl_k2(logps_BT, ref_logps_BT):
  """k2 = (log pi - log pi_ref)^2 / 2."""
  return 0.5 * jnp.square(logps_BT - ref_logps_BT)


def kl_k3(logps_BT, ref_logps_BT):
  """k3 = exp(d) - d - 1, d = log pi_ref - log pi (GRPO's unbiased, non-negative estimator)."""
  d_BT = ref_logps_BT - logps_BT
  return jnp.exp(d_BT) - d_BT - 1.0


KL_ESTIMATORS = {'k1': kl_k1, 'k2': kl_k2, 'k3': kl_k3}

_COMMON_HPARAMS = {'kl_coef': 0.0, 'kl_estimator': 'k3', 'entropy_coef': 0.0}

# ---------------------------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------------------------


def default_hparams(name):
  """All hyper-parameters ``compute_loss(name, ...)`` accepts, with their defaults: the loss's
  own (its `registry.LossSpec`), its default aggregation and the KL / entropy keys."""
  spec = registry.get(name)
  return {**spec.defaults, 'aggregation': spec.aggregation, **_COMMON_HPARAMS}


def _is_traced(x):
  """A hyper-parameter given as an array (a population member's traced value): the population
  engine checked its values before compiling, so only the static ones are checked here."""
  return isinstance(x, jax.Array)


def _check_common(hp):
  """The keys every loss accepts (the loss's own are its spec's to check)."""
  checks.choice('aggregation', hp['aggregation'], AGGREGATIONS)
  checks.choice('kl_estimator', hp['kl_estimator'], KL_ESTIMATORS)
  for key in ('kl_coef', 'entropy_coef'):
    if not _is_traced(hp[key]):
      checks.in_range(key, hp[key], low=0)


def check_hparams(name, hparams):
  """Raises ValueError for an unknown loss, unknown hyper-parameter keys or invalid values
  (before any compute: the trainer calls it on its config)."""
  valid = default_hparams(name)
  unknown = set(hparams) - set(valid)
  if unknown:
    raise ValueError(f'unknown hyper-parameter(s) {sorted(unknown)} for loss {name!r}; '
                     f'valid: {sorted(valid)}')
  hp = {**valid, **hparams}
  _check_common(hp)
  spec = registry.get(name)
  spec.validate({k: hp[k] for k in spec.defaults})
  return hp


def _check_arrays(name, logps, old_logps, advantages, mask, group_size, ref_logps, token_weights,
                  entropy):
  if jnp.ndim(logps) != 2:
    raise ValueError(f'logps must have shape [B, T], got {jnp.shape(logps)}')
  shape = jnp.shape(logps)
  for key, x in (('old_logps', old_logps), ('mask', mask), ('ref_logps', ref_logps),
                 ('token_weights', token_weights), ('entropy', entropy)):
    if x is not None and jnp.shape(x) != shape:
      raise ValueError(f'{key} must have the shape of logps {shape}, got {jnp.shape(x)}')
  if jnp.shape(advantages) != shape[:1]:
    raise ValueError(f'advantages must have shape [B]={shape[:1]}, got {jnp.shape(advantages)}')
  checks.group_size(group_size, shape[0])
  weighted = LOSSES[name].token_weighted
  if weighted and token_weights is None:
    raise ValueError(f'loss {name!r} needs token_weights [B, T]')
  if not weighted and token_weights is not None:
    raise ValueError(f'token_weights are only used by losses {registry.token_weighted()}, not '
                     f'{name!r}')


def asym(w_B, adv_B, *, group_size):
  """Asym = Var_{i in group}(w_i A_i) (paper Eq. 23): per group [M] and the mean over groups.

  w_i is the trajectory weight of Eq. 14 (s_i for GSPO, s_tilde_i for DFPO, per-token ratios for
  GRPO) and w_i A_i the trajectory-level modulation coefficient; the variance is the population
  variance over the G members. It is NOT zero for equal weights: w_i = w gives w^2 Var(A), and
  on-policy (every w = 1) Asym is the mean Var(A) over groups, about 1 - frac_degenerate_groups
  for std-normalised advantages, whatever the method. What cancels shared tokens is
  sum_i w_i A_i = 0 (Eq. 63); Asym measures the spread of the coefficients that cancellation has
  to absorb, and the methods can differ only where the weights differ, i.e. off-policy.

  Args:
    w_B: [B] trajectory weights.
    adv_B: [B] advantages.
    group_size: G, groups are contiguous rows.
  Returns:
    (asym_M [M], mean over groups []).
  """
  chex.assert_rank([w_B, adv_B], 1)
  chex.assert_equal_shape([w_B, adv_B])
  checks.group_size(group_size, w_B.shape[0])
  wa_MG = (w_B * adv_B).astype(jnp.float32).reshape(-1, group_size)
  asym_M = jnp.var(wa_MG, axis=-1)
  return asym_M, jnp.mean(asym_M)


def _pg_coefficients(surrogate_fn, inp, aggregate):
  """c_BT = d pg_loss / d log pi(y_{b,t}): the coefficient of grad log pi of each real token."""

  def pg_loss(log_ratio_BT):
    return -aggregate(surrogate_fn(inp.replace(log_ratio_BT=log_ratio_BT)).obj_BT, inp.mask_BT)

  return jax.grad(pg_loss)(inp.log_ratio_BT) * inp.mask_BT


def _gspo_hparams(name, hp):
  """GSPO's clip for the coefficient-mass reference: the loss's own sequence clip if it has
  one (gspo, gspo_token, dfpo_*), else GSPO's defaults."""
  gspo_keys = LOSSES['gspo'].defaults
  if 'eps' in hp:
    return {k: hp[k] for k in gspo_keys}
  return dict(gspo_keys)


def _effective_step(name, hp, inp, aggregate):
  """coef_mass: sum |c_bt| over the batch; coef_mass_vs_gspo: that over GSPO's mass on the same
  inputs with the same aggregation (and the loss's own sequence clip, if it has one), i.e. the
  step a method takes relative to GSPO's from its weights and clipping alone (1 for GSPO);
  frac_traj_gated: the fraction of trajectories with A != 0 and real tokens whose every
  coefficient is 0 (switched off)."""
  coef_BT = _pg_coefficients(functools.partial(LOSSES[name].surrogate, **hp), inp, aggregate)
  gspo_BT = _pg_coefficients(functools.partial(surrogates.gspo, **_gspo_hparams(name, hp)), inp,
                             aggregate)
  mass = jnp.sum(jnp.abs(coef_BT))
  gspo_mass = jnp.sum(jnp.abs(gspo_BT))
  live_B = (inp.adv_B != 0) & jnp.any(inp.mask_BT > 0, axis=-1)
  gated_B = live_B & jnp.all(coef_BT == 0, axis=-1)
  return {
      'coef_mass':
          mass,
      'coef_mass_vs_gspo':
          jnp.where(gspo_mass > 0, mass / jnp.where(gspo_mass > 0, gspo_mass, 1.0), 1.0),
      'frac_traj_gated':
          jnp.sum(gated_B) / jnp.maximum(jnp.sum(live_B), 1),
  }


def _metrics(sur, inp, ratio_BT, s_B):
  mask_BT = inp.mask_BT
  n = jnp.maximum(jnp.sum(mask_BT), 1.0)
  real_BT = mask_BT > 0
  any_real = jnp.any(real_BT)
  adv_MG = inp.adv_B.reshape(-1, inp.group_size)
  real_B = jnp.any(real_BT, axis=-1)
  return {
      'clip_frac_low':
          jnp.sum(sur.clip_low_BT * mask_BT) / n,
      'clip_frac_high':
          jnp.sum(sur.clip_high_BT * mask_BT) / n,
      'ratio_mean':
          jnp.sum(ratio_BT * mask_BT) / n,
      'ratio_min':
          jnp.where(any_real, jnp.min(jnp.where(real_BT, ratio_BT, jnp.inf)), 1.0),
      'ratio_max':
          jnp.where(any_real, jnp.max(jnp.where(real_BT, ratio_BT, -jnp.inf)), 1.0),
      'seq_ratio_mean':
          jnp.mean(s_B),
      'seq_ratio_min':
          jnp.where(jnp.any(real_B), jnp.min(jnp.where(real_B, s_B, jnp.inf)), 1.0),
      'seq_ratio_max':
          jnp.where(jnp.any(real_B), jnp.max(jnp.where(real_B, s_B, -jnp.inf)), 1.0),
      'approx_kl':
          jnp.sum((ratio_BT - 1.0 - inp.log_ratio_BT) * mask_BT) / n,
      'asym':
          asym(sur.w_B, inp.adv_B, group_size=inp.group_size)[1],
      'asym_gated':
          asym(sur.w_grad_B, inp.adv_B, group_size=inp.group_size)[1],
      'frac_degenerate_groups':
          jnp.mean((jnp.max(adv_MG, axis=-1) == jnp.min(adv_MG, axis=-1)).astype(jnp.float32)),
  }


def loss_inputs(*, logps, old_logps, advantages, mask, group_size, token_weights=None):
  """The `LossInputs` every surrogate sees: log r = log pi - log pi_old on real tokens (0 on
  padding), the advantages, the 0/1 mask, the token weights."""
  mask_BT = (jnp.asarray(mask) > 0).astype(jnp.float32)
  # Behaviour-policy log-probs are data: the ratio's denominator is a constant.
  old_logps_BT = jax.lax.stop_gradient(jnp.asarray(old_logps, jnp.float32))
  # Advantages are per-completion constants (Eq. 1: A_hat does not depend on theta).
  adv_B = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  log_ratio_BT = jnp.where(mask_BT > 0, jnp.asarray(logps, jnp.float32) - old_logps_BT, 0.0)
  return LossInputs(log_ratio_BT=log_ratio_BT, adv_B=adv_B, mask_BT=mask_BT,
                    token_weights_BT=token_weights, group_size=group_size)


def clip_flags(name, *, logps, old_logps, advantages, mask, group_size, token_weights=None,
               **hparams):
  """(clip_low_BT, clip_high_BT): 1.0 where loss ``name``'s clip acts on a token from below /
  above (the per-token view of the clip_frac_* metrics; `jtc.analysis.ledger`)."""
  hp = check_hparams(name, hparams)
  for key in _COMMON_HPARAMS:
    hp.pop(key)
  hp.pop('aggregation')
  sur = LOSSES[name].surrogate(
      loss_inputs(logps=logps, old_logps=old_logps, advantages=advantages, mask=mask,
                  group_size=group_size, token_weights=token_weights), **hp)
  return sur.clip_low_BT, sur.clip_high_BT


def _kl(logps_BT, ref_logps, mask_BT, kl_estimator, aggregate):
  """The aggregated KL estimate of the policy against the frozen reference ``ref_logps``."""
  # The reference policy is frozen.
  ref_logps_BT = jax.lax.stop_gradient(jnp.asarray(ref_logps, jnp.float32))
  # Padding may hold arbitrary values: evaluate the estimator at (0, 0) there (KL term 0).
  kl_BT = kl_estimator(jnp.where(mask_BT > 0, logps_BT, 0.0),
                       jnp.where(mask_BT > 0, ref_logps_BT, 0.0))
  return aggregate(kl_BT, mask_BT)


def compute_loss(name, *, logps, old_logps, advantages, mask, group_size, ref_logps=None,
                 token_weights=None, entropy=None, is_weights=None, **hparams):
  """The loss (to minimise) and metrics of intra-group objective ``name``.

  Args:
    name: a key of ``LOSSES``.
    logps: [B, T] log pi_theta of the sampled tokens (the only differentiated input).
    old_logps: [B, T] log pi_old of the same tokens (behaviour policy; constant).
    advantages: [B] group-relative advantages (constant).
    mask: [B, T] 1 for real completion tokens, 0 for padding (float or bool).
    group_size: G; B = M * G with each group contiguous.
    ref_logps: optional [B, T] reference log-probs for the KL term / ``kl`` metric.
    token_weights: [B, T] per-token coefficients, required by (and only by) 'delta'.
    entropy: optional [B, T] per-token policy entropy (differentiable) for the entropy bonus.
    is_weights: optional [B, T] rollout-mismatch importance weights (`jtc.objectives.corrections`):
      every token's objective is multiplied by its weight before aggregation (a constant).
    **hparams: keys of ``default_hparams(name)``: the loss's own hyper-parameters plus
      ``aggregation``, ``kl_coef``, ``kl_estimator``, ``entropy_coef``. Static under jit.

  Returns:
    (loss, metrics): scalar float32 loss and a flat dict of scalar metrics (module docstring).

  Raises:
    ValueError: unknown name / hyper-parameter / aggregation / kl_estimator / solver, bad
      shapes, B not divisible by group_size, missing inputs the hyper-parameters need.
  """
  hparams = check_hparams(name, hparams)
  _check_arrays(name, logps, old_logps, advantages, mask, group_size, ref_logps, token_weights,
                entropy)
  for coef, given, need in (('kl_coef', ref_logps, 'ref_logps'), ('entropy_coef', entropy,
                                                                  'entropy [B, T]')):
    if (_is_traced(hparams[coef]) or hparams[coef] != 0) and given is None:
      raise ValueError(f'{coef}={hparams[coef]} needs {need}')

  aggregate = AGGREGATIONS[hparams.pop('aggregation')]
  kl_coef = hparams.pop('kl_coef')
  kl_estimator = KL_ESTIMATORS[hparams.pop('kl_estimator')]
  entropy_coef = hparams.pop('entropy_coef')

  logps_BT = jnp.asarray(logps, jnp.float32)
  inp = loss_inputs(logps=logps_BT, old_logps=old_logps, advantages=advantages, mask=mask,
                    group_size=group_size, token_weights=token_weights)
  mask_BT = inp.mask_BT
  sur = LOSSES[name].surrogate(inp, **hparams)
  obj_BT = sur.obj_BT
  if is_weights is not None:
    # The mismatch correction's weights are constants (importance weights of the behaviour
    # policy against the sampler's distribution, not functions of theta).
    is_weights = jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))
    obj_BT = obj_BT * is_weights
  pg_loss = -aggregate(obj_BT, mask_BT)
  loss = pg_loss
  # Metrics are diagnostics: no gradient flows through them.
  sur_sg = jax.tree.map(jax.lax.stop_gradient, sur)
  # Same reason: the ratios are only reported.
  inp_sg = jax.tree.map(jax.lax.stop_gradient, inp)
  metrics = _metrics(sur_sg, inp_sg, jnp.exp(inp_sg.log_ratio_BT),
                     jnp.exp(surrogates.seq_log_ratio(inp_sg)))
  metrics.update(_effective_step(name, hparams, inp_sg, aggregate))
  metrics['pg_loss'] = pg_loss
  if ref_logps is not None:
    kl = _kl(logps_BT, ref_logps, mask_BT, kl_estimator, aggregate)
    metrics['kl'] = kl
    if _is_traced(kl_coef) or kl_coef != 0:
      loss = loss + kl_coef * kl
  if entropy is not None:
    entropy_BT = jnp.where(mask_BT > 0, jnp.asarray(entropy, jnp.float32), 0.0)
    # The logged entropy is the per-token mean for every loss (comparable across methods); the
    # bonus uses the loss's own aggregation.
    metrics['entropy'] = token_mean(entropy_BT, mask_BT)
    if _is_traced(entropy_coef) or entropy_coef != 0:
      loss = loss - entropy_coef * aggregate(entropy_BT, mask_BT)
  # pg_loss / kl / entropy are reported values, not extra gradient paths.
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return loss, {k: v.astype(jnp.float32) for k, v in metrics.items()}
