"""Every loss as a per-token surrogate ``fn(LossInputs, **hparams) -> Surrogate``, each registered
once (`jtc.objectives.registry`: its default aggregation and the valid values of its
hyper-parameters beside it).

The per-token objective ``obj_BT`` of each loss (to be maximised) and what its metrics need; the
entry point that aggregates it into a loss, adds KL / entropy terms and reports the metrics is
`jtc.objectives.compute_loss`.

Dimension key (docs/dimensions.md):
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

Losses (``registry.LOSSES``; hyper-parameters and defaults via ``objectives.default_hparams(name)``,
the table in docs/objectives.md):
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
                         normalised by `jtc.objectives.delta` (the only place): sum lambda_bar ppo / N.

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
"""

import chex
import jax
import jax.numpy as jnp

from jtc.objectives import group_transforms
from jtc.objectives import registry
from jtc.objectives.registry import ABOVE_ONE, ANY_NUMBER, BOOLEAN, NON_NEGATIVE, POSITIVE, Surrogate, one_of, optional

# ---------------------------------------------------------------------------------------------
# Per-token helpers.
# ---------------------------------------------------------------------------------------------


def masked_mean_t(x_BT, mask_BT):
  """[B] mean over real tokens of each completion (0 for a fully masked one)."""
  return jnp.sum(x_BT * mask_BT, axis=-1) / jnp.maximum(jnp.sum(mask_BT, axis=-1), 1.0)


def seq_log_ratio(inp):
  """l_B = mean_t log r_{i,t}, so s_i = exp(l_i) (Eq. 44)."""
  return masked_mean_t(inp.log_ratio_BT, inp.mask_BT)


def _broadcast_seq(x_B, mask_BT):
  return x_B[:, None] * mask_BT


# ---------------------------------------------------------------------------------------------
# Token-factorised losses.
# ---------------------------------------------------------------------------------------------

PPO_RANGES = {'eps_low': POSITIVE, 'eps_high': POSITIVE, 'dual_clip_c': ABOVE_ONE}


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
                   w_B=masked_mean_t(ratio_BT, inp.mask_BT),
                   w_grad_B=masked_mean_t(ratio_BT * free_BT, inp.mask_BT))


@registry.register('grpo', aggregation='seq_mean_token_mean', ranges=PPO_RANGES,
                   about='token PPO clip (Shao et al. 2024; Eq. 8, 77)')
def grpo(inp, *, eps_low=0.2, eps_high=0.2, dual_clip_c=None):
  """GRPO (Shao et al. 2024): token PPO clip, default seq_mean_token_mean (paper Eq. 8, 77)."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


@registry.register('dapo', aggregation='token_mean', ranges=PPO_RANGES,
                   about='token PPO clip, clip-higher (Yu et al. 2025)')
def dapo(inp, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
  """DAPO (Yu et al. 2025): clip-higher eps_high=0.28, default token_mean."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


@registry.register('dr_grpo', aggregation='seq_mean_token_sum_norm', ranges=PPO_RANGES,
                   about='token PPO clip, constant-length sums (Liu et al. 2025)')
def dr_grpo(inp, *, eps_low=0.2, eps_high=0.2, dual_clip_c=None):
  """Dr. GRPO (Liu et al. 2025): PPO clip, default seq_mean_token_sum_norm."""
  return _ppo_clip(inp, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


@registry.register('grpo_fix', aggregation='seq_mean_token_mean', ranges={'eps_high': POSITIVE},
                   about='symmetric clip A clip(r, 0, 1 + eps_high) (Eq. 79-80)')
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
                   w_B=masked_mean_t(ratio_BT, inp.mask_BT),
                   w_grad_B=masked_mean_t(ratio_BT * (1.0 - clip_high_BT), inp.mask_BT))


@registry.register('cispo', aggregation='token_mean', ranges={
    'eps_low': POSITIVE,
    'eps_high': POSITIVE
}, about='clipped IS weight on every token\'s score (MiniMax-M1, 2025)')
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
  return Surrogate(obj_BT=obj_BT, clip_low_BT=(ratio_BT < 1.0 - eps_low).astype(jnp.float32),
                   clip_high_BT=(ratio_BT > 1.0 + eps_high).astype(jnp.float32),
                   w_B=masked_mean_t(weight_BT,
                                     inp.mask_BT), w_grad_B=masked_mean_t(weight_BT, inp.mask_BT))


@registry.register('sapo', aggregation='seq_mean_token_mean', ranges={
    'tau_pos': POSITIVE,
    'tau_neg': POSITIVE
}, about='soft sigmoid gate instead of a clip (Gao et al. 2025)')
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
                   w_B=masked_mean_t(grad_weight_BT, inp.mask_BT),
                   w_grad_B=masked_mean_t(grad_weight_BT, inp.mask_BT))


@registry.register('delta', aggregation='token_mean', ranges=PPO_RANGES, token_weighted=True,
                   about='DAPO surrogate weighted per token by DelTA\'s lambda (2605.21467)')
def delta(inp, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
  """DelTA (2605.21467): the DAPO surrogate with per-token coefficients, lambda_bar * ppo.

    obj_{i,t} = lambda_bar_{i,t} min(r A, clip(r, 1-eps_low, 1+eps_high) A)

  ``token_weights`` are the coefficients as `jtc.objectives.delta.token_coefficients` returns them, already
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
                   clip_high_BT=base.clip_high_BT, w_B=masked_mean_t(lam_BT * ratio_BT,
                                                                     inp.mask_BT),
                   w_grad_B=masked_mean_t(lam_BT * ratio_BT * free_BT, inp.mask_BT))


# ---------------------------------------------------------------------------------------------
# Sequence-level losses.
# ---------------------------------------------------------------------------------------------

SEQ_RANGES = {'eps_low': POSITIVE, 'eps_high': POSITIVE, 'eps': optional(POSITIVE)}


def _seq_clip_bounds(eps_low, eps_high, eps):
  return (eps, eps) if eps is not None else (eps_low, eps_high)


def _seq_clip_flags(s_B, adv_B, mask_BT, lo, hi):
  high_B = (adv_B > 0) & (s_B > 1.0 + hi)
  low_B = (adv_B < 0) & (s_B < 1.0 - lo)
  return (_broadcast_seq(low_B.astype(jnp.float32),
                         mask_BT), _broadcast_seq(high_B.astype(jnp.float32),
                                                  mask_BT), low_B | high_B)


@registry.register('gspo', aggregation='seq_mean_token_mean', ranges=SEQ_RANGES,
                   about='sequence clip on the length-normalised ratio (Zheng et al. 2025; Eq. 42)')
def gspo(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None):
  """GSPO (Zheng et al. 2025; paper Eq. 42): A_i * s_bar_i with s_i = exp(mean_t log r) (Eq. 44).

  Uses the sign-aware post-clip weight s_bar (Eq. 47), equal to the min form by Eq. 49.
  ``eps`` (if not None) sets both clip widths (the paper's symmetric Eq. 42).
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  lo, hi = _seq_clip_bounds(eps_low, eps_high, eps)
  s_B = jnp.exp(seq_log_ratio(inp))
  s_bar_B = group_transforms.post_clip_weight(s_B, inp.adv_B, eps_low=lo, eps_high=hi)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  return Surrogate(obj_BT=_broadcast_seq(inp.adv_B * s_bar_B, inp.mask_BT), clip_low_BT=low_BT,
                   clip_high_BT=high_BT, w_B=s_B, w_grad_B=jnp.where(clipped_B, 0.0, s_B))


@registry.register(
    'gspo_token', aggregation='seq_mean_token_mean', ranges=SEQ_RANGES,
    about='GSPO-token: the sequence ratio on every token\'s score (Zheng et al. 2025)')
def gspo_token(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None):
  """GSPO-token (Zheng et al. 2025): s_{i,t} = sg(s_i) * r_{i,t} / sg(r_{i,t}), clipped per token.

  Its value equals s_i and its gradient is s_i grad log pi_{i,t}; with per-sequence advantages
  it gives the same loss and gradient as ``gspo`` for every aggregation.
  """
  chex.assert_rank([inp.log_ratio_BT, inp.adv_B], [2, 1])
  lo, hi = _seq_clip_bounds(eps_low, eps_high, eps)
  l_B = seq_log_ratio(inp)
  # GSPO-token: the sequence ratio enters as a constant; the gradient goes via each token.
  l_sg_B = jax.lax.stop_gradient(l_B)
  # Constant copy of log r: exp(log r - const) has value 1 and gradient grad log pi_{i,t}.
  log_ratio_const_BT = jax.lax.stop_gradient(inp.log_ratio_BT)
  s_BT = jnp.exp(l_sg_B)[:, None] * jnp.exp(inp.log_ratio_BT - log_ratio_const_BT)
  adv_BT = jnp.broadcast_to(inp.adv_B[:, None], s_BT.shape)
  obj_BT = adv_BT * group_transforms.post_clip_weight(s_BT, adv_BT, eps_low=lo, eps_high=hi)
  s_B = jnp.exp(l_sg_B)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  return Surrogate(obj_BT=obj_BT, clip_low_BT=low_BT, clip_high_BT=high_BT, w_B=s_B,
                   w_grad_B=jnp.where(clipped_B, 0.0, s_B))


CLIP_GATINGS = ('none', 'gspo')
DFPO_RANGES = {
    **SEQ_RANGES, 'stop_gradient': BOOLEAN,
    'global_scale': ANY_NUMBER,
    'clip_gating': one_of(CLIP_GATINGS)
}


def _check_gating(hp):
  """DFPO's gated reading needs the stop-gradient (without it the clip already gates)."""
  if hp.get('clip_gating', 'none') != 'none' and not hp.get('stop_gradient', True):
    raise ValueError(f"clip_gating={hp['clip_gating']!r} needs stop_gradient=True: without the "
                     "stop-gradient the clip already gates the gradient (use 'none')")


def _dfpo(inp, *, transform, transform_kwargs, eps_low, eps_high, eps, stop_gradient, global_scale,
          clip_gating):
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
  l_B = seq_log_ratio(inp)
  s_B = jnp.exp(l_B)
  s_bar_B = group_transforms.post_clip_weight(s_B, inp.adv_B, eps_low=lo, eps_high=hi)
  if global_scale is not None:
    s_tilde_B = group_transforms.transform_batch('global_scale', s_bar_B, inp.adv_B,
                                                 group_size=inp.group_size, c=global_scale)
  else:
    s_tilde_B = group_transforms.transform_batch(transform, s_bar_B, inp.adv_B,
                                                 group_size=inp.group_size, **transform_kwargs)
  low_BT, high_BT, clipped_B = _seq_clip_flags(s_B, inp.adv_B, inp.mask_BT, lo, hi)
  if not stop_gradient:
    return Surrogate(obj_BT=_broadcast_seq(inp.adv_B * s_tilde_B, inp.mask_BT), clip_low_BT=low_BT,
                     clip_high_BT=high_BT, w_B=s_tilde_B, w_grad_B=s_tilde_B)
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


@registry.register('dfpo_min_replace', aggregation='seq_mean_token_mean', ranges=DFPO_RANGES,
                   check=_check_gating,
                   about='GSPO with s_tilde = min_j s_bar_j in each group (Eq. 50)')
def dfpo_min_replace(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                     global_scale=None, clip_gating='none'):
  """DFPO (Min-Replace): s_tilde_i = min_j s_bar_j (Eq. 50) in the GSPO objective."""
  return _dfpo(inp, transform='min_replace', transform_kwargs={}, eps_low=eps_low,
               eps_high=eps_high, eps=eps, stop_gradient=stop_gradient, global_scale=global_scale,
               clip_gating=clip_gating)


@registry.register('dfpo_orth_proj', aggregation='seq_mean_token_mean', ranges=DFPO_RANGES,
                   check=_check_gating, about='GSPO with s_bar projected orthogonal to A (Eq. 18)')
def dfpo_orth_proj(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                   global_scale=None, clip_gating='none'):
  """DFPO (Orth-Proj): s_tilde = s_bar - (A.s_bar / |A|^2) A (Eq. 18); may be negative."""
  return _dfpo(inp, transform='orth_proj', transform_kwargs={}, eps_low=eps_low, eps_high=eps_high,
               eps=eps, stop_gradient=stop_gradient, global_scale=global_scale,
               clip_gating=clip_gating)


SOLVERS = {'qp': 'pos_orth_proj_qp', 'truncate_rebalance': 'pos_orth_proj_truncate_rebalance'}


@registry.register(
    'dfpo_pos_orth_proj', aggregation='seq_mean_token_mean', ranges={
        **DFPO_RANGES, 'solver': one_of(tuple(SOLVERS)),
        'trunc_eps': NON_NEGATIVE
    }, check=_check_gating, about='GSPO with the non-negative projection (Eq. 51, or Eq. 52-55)')
def dfpo_pos_orth_proj(inp, *, eps_low=3e-4, eps_high=4e-4, eps=None, stop_gradient=True,
                       global_scale=None, clip_gating='none', solver='qp', trunc_eps=1e-3):
  """DFPO (Positive Orth-Proj): the non-negative QP of Eq. 51 (solver='qp', exact) or its
  truncate-and-rebalance approximation Eq. 52-55 (solver='truncate_rebalance', trunc_eps)."""
  kwargs = {'trunc_eps': trunc_eps} if solver == 'truncate_rebalance' else {}
  return _dfpo(inp, transform=SOLVERS[solver], transform_kwargs=kwargs, eps_low=eps_low,
               eps_high=eps_high, eps=eps, stop_gradient=stop_gradient, global_scale=global_scale,
               clip_gating=clip_gating)
