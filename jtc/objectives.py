"""Intra-group RL objectives on per-token log-probs: one entry point, ``compute_loss``.

Dimension key:
  B  batch of completions, B = M * G, each group of G completions contiguous
  M  number of groups (prompts)
  G  group size
  T  completion length (padded; ``mask_BT`` marks real tokens)

Notation (paper 2604.13088, cited "Eq. N"): r_{i,t} = pi_theta / pi_old of token t of
completion i (Eq. 7); s_i = exp(mean_t log r_{i,t}) the length-normalised sequence ratio
(Eq. 44); A_i the group-relative advantage. Every loss builds a per-token *objective* ``obj_BT``
(to be maximised); ``loss = -aggregate(obj_BT) + kl_coef * aggregate(kl_BT)
- entropy_coef * aggregate(entropy_BT)`` is minimised. The gradient flows only through
``logps``; ``old_logps``, ``ref_logps``, ``advantages`` and ``token_weights`` are constants.

Losses (``LOSSES``; hyper-parameters and defaults via ``default_hparams(name)``):
  grpo / dapo / dr_grpo  token-factorised PPO clip min(r A, clip(r, 1-eps_low, 1+eps_high) A),
                         optional dual clip max(., c A) for A < 0; they differ only in defaults
                         (dapo: eps_high=0.28 "clip-higher", token_mean; dr_grpo:
                         seq_mean_token_sum_norm).
  gspo                   sequence clip on s_i: A_i * s_bar_i (Eq. 42 == Eq. 49).
  gspo_token             GSPO-token: s_{i,t} = sg(s_i) r_{i,t} / sg(r_{i,t}), clipped per token.
  sapo                   soft gate f(r) = 4/tau sigmoid(tau (r - 1)), tau_pos / tau_neg by sign.
  cispo                  sg(clip(r, 1-eps_low, 1+eps_high)) A log pi (every token keeps its gradient).
  dfpo_min_replace       GSPO with the in-group transform of Eq. 50 on s_bar.
  dfpo_orth_proj         ... with Eq. 18.
  dfpo_pos_orth_proj     ... with Eq. 51 (solver='qp') or Eq. 52-55 (solver='truncate_rebalance').
  grpo_fix               symmetric clip A * clip(r, 0, 1 + eps_high) (Eq. 79-80).
  delta                  DAPO surrogate weighted by per-token coefficients lambda_bar (DelTA),
                         normalised by `jtc.delta` (the only place): sum lambda_bar ppo / N.

DFPO semantics (Eq. 68/85). s_tilde = T(s_bar, A) per group. With ``stop_gradient=True`` (default)
s_tilde is a constant; ``clip_gating`` picks one of the paper's two readings of GSPO's clip
(`_dfpo` quotes both): 'none' (default, Eq. 68/85 as written) gives every token of completion i
the coefficient s_tilde_i A_i alpha_{i,t} on grad log pi, alpha_{i,t} set by the aggregation
(1/(B |y_i|) for seq_mean_token_mean, the paper's 1/G * 1/|y_i|), so the clip only shapes the
values s_bar and no trajectory is switched off; 'gspo' keeps GSPO's gating (a trajectory GSPO
clips gets no gradient), the reading under which Theorem C.1 / App. K call Min-Replace "a smaller
effective learning rate" than GSPO. The metrics ``coef_mass_vs_gspo`` and ``frac_traj_gated``
show which step a run actually takes.
With ``stop_gradient=False`` the objective is A_i * s_tilde_i(theta) and the gradient flows
through the transform and the clip. Mathematically, with sum_i A_i = 0 in each group and equal
aggregation weight per completion (seq_mean_token_mean, or equal lengths):
  * Min-Replace: sum_i A_i s_min(theta) = s_min(theta) * sum_i A_i == 0 for every theta, so the
    loss and its gradient are identically zero (the ablation learns nothing from the PG term);
  * Orth-Proj / Positive Orth-Proj: sum_i A_i s_tilde_i == 0 by construction, so again the loss
    is identically zero.
With unequal per-completion weights (token_mean and unequal lengths) these are weighted sums
sum_i c_i A_i s_tilde_i, generally non-zero. ``global_scale=c`` replaces the transform by
c * s_bar (paper Table 3 "scale by c"); under clip_gating='gspo' its gradient is exactly c times
GSPO's, the "smaller updates" control the paper means.

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
import inspect

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jtc import group_transforms

# ---------------------------------------------------------------------------------------------
# Inputs and per-loss output.
# ---------------------------------------------------------------------------------------------


@flax.struct.dataclass
class LossInputs:
  """What a loss sees. log_ratio_BT is log r (0 on padding); group_size is static."""
  log_ratio_BT: jax.Array
  adv_B: jax.Array
  mask_BT: jax.Array
  token_weights_BT: jax.Array | None
  group_size: int = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class Surrogate:
  """A loss's per-token objective (maximised) plus what the metrics need.

  obj_BT: per-token objective, aggregated then negated into the loss.
  clip_low_BT / clip_high_BT: 1.0 where the token is clipped from below / above.
  w_B: the trajectory weight w_i of Eq. 14 that Eq. 23's ``asym`` uses: s_i for GSPO (clipped
    or not), s_tilde_i for DFPO, the token-mean ratio for the token-level losses.
  w_grad_B: the weight the gradient actually carries: w_B with 0 wherever the clip switches
    the trajectory's (or, token-averaged, the tokens') gradient off (``asym_gated``).
  """
  obj_BT: jax.Array
  clip_low_BT: jax.Array
  clip_high_BT: jax.Array
  w_B: jax.Array
  w_grad_B: jax.Array


def _masked_mean_t(x_BT, mask_BT):
  """[B] mean over real tokens of each completion (0 for a fully masked one)."""
  return jnp.sum(x_BT * mask_BT, axis=-1) / jnp.maximum(jnp.sum(mask_BT, axis=-1), 1.0)


def _seq_log_ratio(inp):
  """l_B = mean_t log r_{i,t}, so s_i = exp(l_i) (Eq. 44)."""
  return _masked_mean_t(inp.log_ratio_BT, inp.mask_BT)


def _broadcast_seq(x_B, mask_BT):
  return x_B[:, None] * mask_BT


# ---------------------------------------------------------------------------------------------
# Token-factorised losses.
# ---------------------------------------------------------------------------------------------


def _ppo_clip(inp, *, eps_low, eps_high, dual_clip_c):
  """min(r A, clip(r, 1-eps_low, 1+eps_high) A); for A < 0 optionally max(., c A) (dual clip)."""
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  ratio_BT = jnp.exp(inp.log_ratio_BT)
  adv_B1 = inp.adv_B[:, None]
  clipped_BT = jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  obj_BT = jnp.minimum(ratio_BT * adv_B1, clipped_BT * adv_B1)
  clip_high_BT = (adv_B1 > 0) & (ratio_BT > 1.0 + eps_high)
  clip_low_BT = (adv_B1 < 0) & (ratio_BT < 1.0 - eps_low)
  if dual_clip_c is not None:
    dual_BT = (adv_B1 < 0) & (ratio_BT > dual_clip_c)
    obj_BT = jnp.where(adv_B1 < 0, jnp.maximum(obj_BT, dual_clip_c * adv_B1), obj_BT)
    clip_high_BT = clip_high_BT | dual_BT
  free_BT = 1.0 - (clip_low_BT | clip_high_BT).astype(jnp.float32)
  return Surrogate(obj_BT=obj_BT, clip_low_BT=clip_low_BT.astype(jnp.float32),
                   clip_high_BT=clip_high_BT.astype(jnp.float32),
                   w_B=_masked_mean_t(ratio_BT, inp.mask_BT),
                   w_grad_B=_masked_mean_t(ratio_BT * free_BT, inp.mask_BT))


def grpo(inp, *, eps_low=0.2, eps_high=0.2, dual_clip_c=None):
  """GRPO (Shao et al. 2024): token PPO clip, default seq_mean_token_mean (paper Eq. 8, 77)."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


def dapo(inp, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
  """DAPO (Yu et al. 2025): clip-higher eps_high=0.28, default token_mean."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


def dr_grpo(inp, *, eps_low=0.2, eps_high=0.2, dual_clip_c=None):
  """Dr. GRPO (Liu et al. 2025): PPO clip, default seq_mean_token_sum_norm."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


def grpo_fix(inp, *, eps_high=0.2):
  """GRPO-fix, symmetric clip (paper Eq. 79-80): A * clip(r, 0, 1 + eps_high).

  The clip no longer depends on the sign of A, so tokens shared by the group with equal r get
  the coefficient phi(r) sum_i A_i = 0 (Eq. 82) whatever r is.
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  ratio_BT = jnp.exp(inp.log_ratio_BT)
  obj_BT = jnp.clip(ratio_BT, 0.0, 1.0 + eps_high) * inp.adv_B[:, None]
  clip_high_BT = (ratio_BT > 1.0 + eps_high).astype(jnp.float32)
  return Surrogate(obj_BT=obj_BT, clip_low_BT=jnp.zeros_like(obj_BT), clip_high_BT=clip_high_BT,
                   w_B=_masked_mean_t(ratio_BT, inp.mask_BT),
                   w_grad_B=_masked_mean_t(ratio_BT * (1.0 - clip_high_BT), inp.mask_BT))


def cispo(inp, *, eps_low=1.0, eps_high=0.28):
  """CISPO (MiniMax-M1, 2025): sg(clip(r, 1-eps_low, 1+eps_high)) A log pi per token.

  Written as sg(clip(r)) A exp(log r - sg(log r)) so the value is clip(r) A while the gradient
  is clip(r) A grad log pi for every token (clipping bounds the weight, never drops a token).
  eps_low=1.0 means no lower clip (the MiniMax-M1 setting).
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  ratio_BT = jnp.exp(inp.log_ratio_BT)
  weight_BT = jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  # CISPO treats the clipped IS weight as a constant coefficient of grad log pi.
  weight_BT = jax.lax.stop_gradient(weight_BT)
  # Constant copy of log r: exp(log r - const) has value 1 and gradient grad log pi.
  log_ratio_const_BT = jax.lax.stop_gradient(inp.log_ratio_BT)
  obj_BT = weight_BT * inp.adv_B[:, None] * jnp.exp(inp.log_ratio_BT - log_ratio_const_BT)
  return Surrogate(obj_BT=obj_BT,
                   clip_low_BT=(ratio_BT < 1.0 - eps_low).astype(jnp.float32),
                   clip_high_BT=(ratio_BT > 1.0 + eps_high).astype(jnp.float32),
                   w_B=_masked_mean_t(weight_BT, inp.mask_BT),
                   w_grad_B=_masked_mean_t(weight_BT, inp.mask_BT))


def sapo(inp, *, tau_pos=1.0, tau_neg=1.05):
  """SAPO (Gao et al. 2025): soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)), objective f(r) A.

  tau = tau_pos for A > 0, tau_neg otherwise; f'(r) = 4 sigma (1 - sigma) equals 1 at r = 1 and
  decays smoothly away from it (no hard clip: clip fractions are 0).
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  ratio_BT = jnp.exp(inp.log_ratio_BT)
  tau_B1 = jnp.where(inp.adv_B[:, None] > 0, tau_pos, tau_neg)
  sig_BT = jax.nn.sigmoid(tau_B1 * (ratio_BT - 1.0))
  obj_BT = (4.0 / tau_B1) * sig_BT * inp.adv_B[:, None]
  grad_weight_BT = 4.0 * sig_BT * (1.0 - sig_BT) * ratio_BT
  zeros_BT = jnp.zeros_like(obj_BT)
  return Surrogate(obj_BT=obj_BT, clip_low_BT=zeros_BT, clip_high_BT=zeros_BT,
                   w_B=_masked_mean_t(grad_weight_BT, inp.mask_BT),
                   w_grad_B=_masked_mean_t(grad_weight_BT, inp.mask_BT))


def delta(inp, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
  """DelTA (2605.21467): the DAPO surrogate with per-token coefficients, lambda_bar * ppo.

    obj_{i,t} = lambda_bar_{i,t} min(r A, clip(r, 1-eps_low, 1+eps_high) A)

  ``token_weights`` are the coefficients as `jtc.delta.token_coefficients` returns them, already
  normalised there (lambda_bar = lambda N / Z over the rollout batch, eq:DelTA-weighted-objective);
  with DAPO's token_mean this loss is sum lambda_bar ppo / N = sum lambda ppo / Z, the paper's
  self-normalised objective with the standard token-count normaliser. Nothing is normalised
  here: the normalisation has exactly one home, so the "w/o lambda-norm" ablation (lambda in
  [lam_min, lam_max] used as is) gives sum lambda ppo / N, as it should.
  """
  chex.assert_rank(inp.token_weights_BT, 2)
  chex.assert_equal_shape([inp.token_weights_BT, inp.log_ratio_BT])
  # DelTA's coefficients are estimated once per rollout batch and held fixed (constants).
  lam_BT = jax.lax.stop_gradient(inp.token_weights_BT.astype(jnp.float32)) * inp.mask_BT
  base = _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)
  ratio_BT = jnp.exp(inp.log_ratio_BT)
  free_BT = 1.0 - jnp.maximum(base.clip_low_BT, base.clip_high_BT)
  return Surrogate(obj_BT=lam_BT * base.obj_BT, clip_low_BT=base.clip_low_BT,
                   clip_high_BT=base.clip_high_BT,
                   w_B=_masked_mean_t(lam_BT * ratio_BT, inp.mask_BT),
                   w_grad_B=_masked_mean_t(lam_BT * ratio_BT * free_BT, inp.mask_BT))


# ---------------------------------------------------------------------------------------------
# Sequence-level losses.
# ---------------------------------------------------------------------------------------------


def _seq_clip_bounds(eps_low, eps_high, eps):
  return (eps, eps) if eps is not None else (eps_low, eps_high)


def _seq_clip_flags(s_B, adv_B, mask_BT, lo, hi):
  high_B = (adv_B > 0) & (s_B > 1.0 + hi)
  low_B = (adv_B < 0) & (s_B < 1.0 - lo)
  return (_broadcast_seq(low_B.astype(jnp.float32), mask_BT),
          _broadcast_seq(high_B.astype(jnp.float32), mask_BT), low_B | high_B)


def gspo(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None):
  """GSPO (Zheng et al. 2025; paper Eq. 42): A_i * s_bar_i with s_i = exp(mean_t log r) (Eq. 44).

  Uses the sign-aware post-clip weight s_bar (Eq. 47), equal to the min form by Eq. 49.
  ``eps`` (if not None) sets both clip widths (the paper's symmetric Eq. 42).
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  lo, hi = _seq_clip_bounds(eps_low, eps_high, eps)
  s_B = jnp.exp(_seq_log_ratio(inp))
  s_bar_B = group_transforms.post_clip_weight(s_B, inp.adv_B, eps_low=lo, eps_high=hi)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  return Surrogate(obj_BT=_broadcast_seq(inp.adv_B * s_bar_B, inp.mask_BT), clip_low_BT=low_BT,
                   clip_high_BT=high_BT, w_B=s_B, w_grad_B=jnp.where(clipped_B, 0.0, s_B))


def gspo_token(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None):
  """GSPO-token (Zheng et al. 2025): s_{i,t} = sg(s_i) * r_{i,t} / sg(r_{i,t}), clipped per token.

  Its value equals s_i and its gradient is s_i grad log pi_{i,t}; with per-sequence advantages
  it gives the same loss and gradient as ``gspo`` for every aggregation.
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  lo, hi = _seq_clip_bounds(eps_low, eps_high, eps)
  l_B = _seq_log_ratio(inp)
  # GSPO-token: the sequence ratio enters as a constant; the gradient goes via each token.
  l_sg_B = jax.lax.stop_gradient(l_B)
  # Constant copy of log r: exp(log r - const) has value 1 and gradient grad log pi_{i,t}.
  log_ratio_const_BT = jax.lax.stop_gradient(inp.log_ratio_BT)
  s_BT = jnp.exp(l_sg_B)[:, None] * jnp.exp(inp.log_ratio_BT - log_ratio_const_BT)
  adv_BT = jnp.broadcast_to(inp.adv_B[:, None], s_BT.shape)
  obj_BT = adv_BT * group_transforms.post_clip_weight(s_BT, adv_BT, eps_low=lo, eps_high=hi)
  s_B = jnp.exp(l_sg_B)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  return Surrogate(obj_BT=obj_BT, clip_low_BT=low_BT, clip_high_BT=high_BT,
                   w_B=s_B, w_grad_B=jnp.where(clipped_B, 0.0, s_B))


CLIP_GATINGS = ('none', 'gspo')


def _dfpo(inp, *, transform, transform_kwargs, eps_low, eps_high, eps, stop_gradient,
          global_scale, clip_gating):
  """GSPO with an in-group transform of the post-clip weights (paper App. B, Eq. 68/85).

  s_bar = post_clip_weight(s) (Eq. 47), s_tilde = transform(s_bar, A) per group (or c * s_bar
  with ``global_scale``). With ``stop_gradient`` (the paper's convention, App. D) s_tilde is a
  constant and the paper leaves open how GSPO's clip acts on the gradient; both readings:

  * clip_gating='none' (default; Eq. 68/85 as written, "the linear segment, ignoring subgradient
    details at the breakpoints"): obj_i = A_i sg(s_tilde_i) exp(l_i - sg(l_i)). Every
    completion carries s_tilde_i A_i on its score term; the clip only shapes the values s_bar and
    never switches a trajectory off, so shared tokens cancel exactly whatever the clip does.
  * clip_gating='gspo' (App. B: DFPO keeps GSPO's "sequence-level clipping framework";
    Theorem C.1 / App. K: Min-Replace "only shrinks the update magnitudes ... a smaller
    effective learning rate" than GSPO): obj_i = A_i sg(s_tilde_i / s_bar_i) s_bar_i(theta).
    Same value A_i s_tilde_i; gradient s_tilde_i A_i grad l_i where GSPO's clip is inactive and
    exactly 0 where it is active (s_bar is then a constant), so every per-trajectory coefficient
    is phi_i in [0, 1] times GSPO's (Eq. 62, with phi_i = 0 on the trajectories GSPO drops).
    Cancellation on shared tokens then holds among the trajectories the clip keeps.

  Without stop-gradient the objective A_i s_tilde_i(theta) is differentiated through the
  transform and the clip, which is already GSPO's gating: ``clip_gating`` must stay 'none'.
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  lo, hi = _seq_clip_bounds(eps_low, eps_high, eps)
  l_B = _seq_log_ratio(inp)
  s_B = jnp.exp(l_B)
  s_bar_B = group_transforms.post_clip_weight(s_B, inp.adv_B, eps_low=lo, eps_high=hi)
  if global_scale is not None:
    s_tilde_B = group_transforms.transform_batch(
        'global_scale', s_bar_B, inp.adv_B, group_size=inp.group_size, c=global_scale)
  else:
    s_tilde_B = group_transforms.transform_batch(
        transform, s_bar_B, inp.adv_B, group_size=inp.group_size, **transform_kwargs)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  if not stop_gradient:
    return Surrogate(obj_BT=_broadcast_seq(inp.adv_B * s_tilde_B, inp.mask_BT),
                     clip_low_BT=low_BT, clip_high_BT=high_BT, w_B=s_tilde_B,
                     w_grad_B=s_tilde_B)
  # Eq. 68/85: s_tilde is a per-group control variable, not differentiated (App. D convention).
  s_tilde_B = jax.lax.stop_gradient(s_tilde_B)
  if clip_gating == 'gspo':
    # The factor phi_i = s_tilde_i / s_bar_i is the constant of Eq. 59 (Theorem C.1); only
    # s_bar_i(theta) is differentiated, so GSPO's clip switches the gradient off where active.
    phi_B = jax.lax.stop_gradient(
        jnp.where(s_bar_B > 0, s_tilde_B / jnp.where(s_bar_B > 0, s_bar_B, 1.0), 0.0))
    obj_B = inp.adv_B * phi_B * s_bar_B
    w_grad_B = jnp.where(clipped_B, 0.0, s_tilde_B)
  else:
    # Constant copy of l_i: exp(l_i - const) has value 1 and gradient mean_t grad log pi_{i,t},
    # the score term of Eq. 85 with alpha_{i,t} = 1/|y_i|.
    l_const_B = jax.lax.stop_gradient(l_B)
    obj_B = inp.adv_B * s_tilde_B * jnp.exp(l_B - l_const_B)
    w_grad_B = s_tilde_B
  return Surrogate(obj_BT=_broadcast_seq(obj_B, inp.mask_BT), clip_low_BT=low_BT,
                   clip_high_BT=high_BT, w_B=s_tilde_B, w_grad_B=w_grad_B)


def dfpo_min_replace(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                     global_scale=None, clip_gating='none'):
  """DFPO (Min-Replace): s_tilde_i = min_j s_bar_j (Eq. 50) in the GSPO objective."""
  return _dfpo(inp, transform='min_replace', transform_kwargs={}, eps_low=eps_low,
               eps_high=eps_high, eps=eps, stop_gradient=stop_gradient,
               global_scale=global_scale, clip_gating=clip_gating)


def dfpo_orth_proj(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                   global_scale=None, clip_gating='none'):
  """DFPO (Orth-Proj): s_tilde = s_bar - (A.s_bar / |A|^2) A (Eq. 18); may be negative."""
  return _dfpo(inp, transform='orth_proj', transform_kwargs={}, eps_low=eps_low,
               eps_high=eps_high, eps=eps, stop_gradient=stop_gradient,
               global_scale=global_scale, clip_gating=clip_gating)


_SOLVERS = {'qp': 'pos_orth_proj_qp', 'truncate_rebalance': 'pos_orth_proj_truncate_rebalance'}


def dfpo_pos_orth_proj(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                       global_scale=None, clip_gating='none', solver='qp', trunc_eps=1e-3):
  """DFPO (Positive Orth-Proj): the non-negative QP of Eq. 51 (solver='qp', exact) or its
  truncate-and-rebalance approximation Eq. 52-55 (solver='truncate_rebalance', trunc_eps)."""
  kwargs = {'trunc_eps': trunc_eps} if solver == 'truncate_rebalance' else {}
  return _dfpo(inp, transform=_SOLVERS[solver], transform_kwargs=kwargs, eps_low=eps_low,
               eps_high=eps_high, eps=eps, stop_gradient=stop_gradient,
               global_scale=global_scale, clip_gating=clip_gating)


LOSSES = {
    'grpo': grpo,
    'dapo': dapo,
    'dr_grpo': dr_grpo,
    'gspo': gspo,
    'gspo_token': gspo_token,
    'sapo': sapo,
    'cispo': cispo,
    'dfpo_min_replace': dfpo_min_replace,
    'dfpo_orth_proj': dfpo_orth_proj,
    'dfpo_pos_orth_proj': dfpo_pos_orth_proj,
    'grpo_fix': grpo_fix,
    'delta': delta,
}

DEFAULT_AGGREGATION = {
    'grpo': 'seq_mean_token_mean',
    'dapo': 'token_mean',
    'dr_grpo': 'seq_mean_token_sum_norm',
    'gspo': 'seq_mean_token_mean',
    'gspo_token': 'seq_mean_token_mean',
    'sapo': 'seq_mean_token_mean',
    'cispo': 'token_mean',
    'dfpo_min_replace': 'seq_mean_token_mean',
    'dfpo_orth_proj': 'seq_mean_token_mean',
    'dfpo_pos_orth_proj': 'seq_mean_token_mean',
    'grpo_fix': 'seq_mean_token_mean',
    'delta': 'token_mean',
}

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
  return jnp.mean(_masked_mean_t(x_BT, mask_BT))


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


def _check_name(name):
  if name not in LOSSES:
    raise ValueError(f'unknown loss {name!r}; valid: {sorted(LOSSES)}')


@functools.cache
def _loss_defaults(name):
  params = inspect.signature(LOSSES[name]).parameters
  return {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def default_hparams(name):
  """All hyper-parameters ``compute_loss(name, ...)`` accepts, with their defaults."""
  _check_name(name)
  return {**_loss_defaults(name), 'aggregation': DEFAULT_AGGREGATION[name], **_COMMON_HPARAMS}


def _choice(key, value, valid):
  if value not in valid:
    raise ValueError(f'{key}={value!r} is not valid; valid: {sorted(valid)}')


def _check_hparams(name, hp):
  _choice('aggregation', hp['aggregation'], AGGREGATIONS)
  _choice('kl_estimator', hp['kl_estimator'], KL_ESTIMATORS)
  if 'solver' in hp:
    _choice('solver', hp['solver'], _SOLVERS)
  if 'clip_gating' in hp:
    _choice('clip_gating', hp['clip_gating'], CLIP_GATINGS)
    if hp['clip_gating'] != 'none' and not hp['stop_gradient']:
      raise ValueError(f"clip_gating={hp['clip_gating']!r} needs stop_gradient=True: without the "
                       "stop-gradient the clip already gates the gradient (use 'none')")
  for key in ('eps_low', 'eps_high', 'eps', 'trunc_eps', 'tau_pos', 'tau_neg', 'kl_coef',
              'entropy_coef'):
    if hp.get(key) is not None and not hp[key] >= 0:
      raise ValueError(f'{key}={hp[key]!r} for loss {name!r} must be >= 0')
  if hp.get('dual_clip_c') is not None and not hp['dual_clip_c'] > 1:
    raise ValueError(f'dual_clip_c={hp["dual_clip_c"]!r} must be None (off) or > 1')
  for key in ('tau_pos', 'tau_neg'):
    if key in hp and not hp[key] > 0:
      raise ValueError(f'{key}={hp[key]!r} must be > 0')


def check_hparams(name, hparams):
  """Raises ValueError for an unknown loss, unknown hyper-parameter keys or invalid values
  (before any compute: the trainer calls it on its config)."""
  _check_name(name)
  valid = default_hparams(name)
  unknown = set(hparams) - set(valid)
  if unknown:
    raise ValueError(f'unknown hyper-parameter(s) {sorted(unknown)} for loss {name!r}; '
                     f'valid: {sorted(valid)}')
  hp = {**valid, **hparams}
  _check_hparams(name, hp)
  return hp


def _check_arrays(name, logps, old_logps, advantages, mask, group_size, ref_logps,
                  token_weights, entropy):
  if jnp.ndim(logps) != 2:
    raise ValueError(f'logps must have shape [B, T], got {jnp.shape(logps)}')
  shape = jnp.shape(logps)
  for key, x in (('old_logps', old_logps), ('mask', mask), ('ref_logps', ref_logps),
                 ('token_weights', token_weights), ('entropy', entropy)):
    if x is not None and jnp.shape(x) != shape:
      raise ValueError(f'{key} must have the shape of logps {shape}, got {jnp.shape(x)}')
  if jnp.shape(advantages) != shape[:1]:
    raise ValueError(f'advantages must have shape [B]={shape[:1]}, got {jnp.shape(advantages)}')
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f'group_size={group_size!r} must be a positive int')
  if shape[0] % group_size:
    raise ValueError(f'batch size B={shape[0]} is not divisible by group_size={group_size}')
  if name == 'delta' and token_weights is None:
    raise ValueError("loss 'delta' needs token_weights [B, T]")
  if name != 'delta' and token_weights is not None:
    raise ValueError(f"token_weights are only used by loss 'delta', not {name!r}")


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
  if not isinstance(group_size, int) or group_size < 1 or w_B.shape[0] % group_size:
    raise ValueError(f'group_size={group_size!r} must be a positive int dividing B={w_B.shape[0]}')
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
  gspo_keys = _loss_defaults('gspo')
  if 'eps' in hp:
    return {k: hp[k] for k in gspo_keys}
  return dict(gspo_keys)


def _effective_step(name, hp, inp, aggregate):
  """coef_mass: sum |c_bt| over the batch; coef_mass_vs_gspo: that over GSPO's mass on the same
  inputs with the same aggregation (and the loss's own sequence clip, if it has one), i.e. the
  step a method takes relative to GSPO's from its weights and clipping alone (1 for GSPO);
  frac_traj_gated: the fraction of trajectories with A != 0 and real tokens whose every
  coefficient is 0 (switched off)."""
  coef_BT = _pg_coefficients(functools.partial(LOSSES[name], **hp), inp, aggregate)
  gspo_BT = _pg_coefficients(functools.partial(gspo, **_gspo_hparams(name, hp)), inp, aggregate)
  mass = jnp.sum(jnp.abs(coef_BT))
  gspo_mass = jnp.sum(jnp.abs(gspo_BT))
  live_B = (inp.adv_B != 0) & jnp.any(inp.mask_BT > 0, axis=-1)
  gated_B = live_B & jnp.all(coef_BT == 0, axis=-1)
  return {
      'coef_mass': mass,
      'coef_mass_vs_gspo': jnp.where(gspo_mass > 0, mass / jnp.where(gspo_mass > 0, gspo_mass, 1.0),
                                     1.0),
      'frac_traj_gated': jnp.sum(gated_B) / jnp.maximum(jnp.sum(live_B), 1),
  }


def _metrics(sur, inp, ratio_BT, s_B):
  mask_BT = inp.mask_BT
  n = jnp.maximum(jnp.sum(mask_BT), 1.0)
  real_BT = mask_BT > 0
  any_real = jnp.any(real_BT)
  adv_MG = inp.adv_B.reshape(-1, inp.group_size)
  real_B = jnp.any(real_BT, axis=-1)
  return {
      'clip_frac_low': jnp.sum(sur.clip_low_BT * mask_BT) / n,
      'clip_frac_high': jnp.sum(sur.clip_high_BT * mask_BT) / n,
      'ratio_mean': jnp.sum(ratio_BT * mask_BT) / n,
      'ratio_min': jnp.where(any_real, jnp.min(jnp.where(real_BT, ratio_BT, jnp.inf)), 1.0),
      'ratio_max': jnp.where(any_real, jnp.max(jnp.where(real_BT, ratio_BT, -jnp.inf)), 1.0),
      'seq_ratio_mean': jnp.mean(s_B),
      'seq_ratio_min': jnp.where(jnp.any(real_B), jnp.min(jnp.where(real_B, s_B, jnp.inf)), 1.0),
      'seq_ratio_max': jnp.where(jnp.any(real_B), jnp.max(jnp.where(real_B, s_B, -jnp.inf)),
                                 1.0),
      'approx_kl': jnp.sum((ratio_BT - 1.0 - inp.log_ratio_BT) * mask_BT) / n,
      'asym': asym(sur.w_B, inp.adv_B, group_size=inp.group_size)[1],
      'asym_gated': asym(sur.w_grad_B, inp.adv_B, group_size=inp.group_size)[1],
      'frac_degenerate_groups': jnp.mean(
          (jnp.max(adv_MG, axis=-1) == jnp.min(adv_MG, axis=-1)).astype(jnp.float32)),
  }


def compute_loss(name, *, logps, old_logps, advantages, mask, group_size, ref_logps=None,
                 token_weights=None, entropy=None, **hparams):
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
    **hparams: keys of ``default_hparams(name)``: the loss's own hyper-parameters plus
      ``aggregation``, ``kl_coef``, ``kl_estimator``, ``entropy_coef``. Static under jit.

  Returns:
    (loss, metrics): scalar float32 loss and a flat dict of scalar metrics (module docstring).

  Raises:
    ValueError: unknown name / hyper-parameter / aggregation / kl_estimator / solver, bad
      shapes, B not divisible by group_size, missing inputs the hyper-parameters need.
  """
  hp = check_hparams(name, hparams)
  _check_arrays(name, logps, old_logps, advantages, mask, group_size, ref_logps, token_weights,
                entropy)
  if hp['kl_coef'] != 0 and ref_logps is None:
    raise ValueError(f'kl_coef={hp["kl_coef"]} needs ref_logps')
  if hp['entropy_coef'] != 0 and entropy is None:
    raise ValueError(f'entropy_coef={hp["entropy_coef"]} needs entropy [B, T]')

  aggregate = AGGREGATIONS[hp.pop('aggregation')]
  kl_coef = hp.pop('kl_coef')
  kl_estimator = KL_ESTIMATORS[hp.pop('kl_estimator')]
  entropy_coef = hp.pop('entropy_coef')

  logps_BT = jnp.asarray(logps, jnp.float32)
  mask_BT = (jnp.asarray(mask) > 0).astype(jnp.float32)
  # Behaviour-policy log-probs are data: the ratio's denominator is a constant.
  old_logps_BT = jax.lax.stop_gradient(jnp.asarray(old_logps, jnp.float32))
  # Advantages are per-completion constants (Eq. 1: A_hat does not depend on theta).
  adv_B = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  log_ratio_BT = jnp.where(mask_BT > 0, logps_BT - old_logps_BT, 0.0)
  inp = LossInputs(log_ratio_BT=log_ratio_BT, adv_B=adv_B, mask_BT=mask_BT,
                   token_weights_BT=token_weights, group_size=group_size)

  sur = LOSSES[name](inp, **hp)
  pg_loss = -aggregate(sur.obj_BT, mask_BT)
  loss = pg_loss
  # Metrics are diagnostics: no gradient flows through them.
  sur_sg = jax.tree.map(jax.lax.stop_gradient, sur)
  # Same reason: the ratios are only reported.
  inp_sg = jax.tree.map(jax.lax.stop_gradient, inp)
  metrics = _metrics(sur_sg, inp_sg, jnp.exp(inp_sg.log_ratio_BT),
                     jnp.exp(_seq_log_ratio(inp_sg)))
  metrics.update(_effective_step(name, hp, inp_sg, aggregate))
  metrics['pg_loss'] = pg_loss
  if ref_logps is not None:
    # The reference policy is frozen.
    ref_logps_BT = jax.lax.stop_gradient(jnp.asarray(ref_logps, jnp.float32))
    # Padding may hold arbitrary values: evaluate the estimator at (0, 0) there (KL term 0).
    kl_BT = kl_estimator(jnp.where(mask_BT > 0, logps_BT, 0.0),
                         jnp.where(mask_BT > 0, ref_logps_BT, 0.0))
    kl = aggregate(kl_BT, mask_BT)
    metrics['kl'] = kl
    if kl_coef != 0:
      loss = loss + kl_coef * kl
  if entropy is not None:
    entropy_BT = jnp.where(mask_BT > 0, jnp.asarray(entropy, jnp.float32), 0.0)
    # The logged entropy is the per-token mean for every loss (comparable across methods); the
    # bonus uses the loss's own aggregation.
    metrics['entropy'] = token_mean(entropy_BT, mask_BT)
    if entropy_coef != 0:
      loss = loss - entropy_coef * aggregate(entropy_BT, mask_BT)
  # pg_loss / kl / entropy are reported values, not extra gradient paths.
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return loss, {k: v.astype(jnp.float32) for k, v in metrics.items()}
