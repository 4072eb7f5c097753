"""Group-relative advantages over contiguous groups of G completions of one prompt.

Dimension key (docs/dimensions.md):
  B  batch of completions, B = M * G, each group contiguous
  M  number of groups (prompts)
  G  group size (completions per prompt)

Every estimator maps the rewards of one group ``r_G`` to advantages ``A_G``:

  grpo     A_i = (r_i - mean(r)) / (std(r) + eps)                  (paper Eq. 43; Shao et al. 2024)
  dr_grpo  A_i = r_i - mean(r)                                      (Liu et al. 2025, "Dr. GRPO")
  rloo     A_i = r_i - mean_{j != i} r_j = G / (G - 1) (r_i - mean(r))  (Ahmadian et al. 2024)

A zero-variance group (all rewards identical, tested exactly with max == min) gets advantages of
exactly 0, never NaN, and is counted in the ``frac_zero_std`` metric. All three estimators give
zero-mean advantages in each group, the premise of the token-cancellation argument (paper Eq. 6).

``sign`` keeps the advantages of one sign only (`keep_sign`): 'positive' trains on the rollouts
that beat their group's baseline and nothing else (the positive-only control of the Cancellation
Hypothesis, Cheng et al. 2026, arXiv 2605.08666), 'negative' on the others; 'both' (default) is
every estimator as written. One sign breaks the zero group mean on purpose: nothing is left to
cancel.

``batch_normalize=True`` then divides by the standard deviation of the advantages over the whole
batch (no re-centring: the group means are already zero, and zero-variance groups stay exactly 0).
"""

import chex
import jax.numpy as jnp


def _group_is_constant(rewards_MG):
  """[M] bool: True where every reward of the group is identical (exact test, no tolerance)."""
  return jnp.max(rewards_MG, axis=-1) == jnp.min(rewards_MG, axis=-1)


def grpo(rewards_MG, *, eps, std_ddof):
  """A_i = (r_i - mean_G r) / (std_G r + eps), std with ``std_ddof`` (paper Eq. 43)."""
  chex.assert_rank(rewards_MG, 2)
  centred_MG = rewards_MG - jnp.mean(rewards_MG, axis=-1, keepdims=True)
  std_M1 = jnp.std(rewards_MG, axis=-1, ddof=std_ddof, keepdims=True)
  return centred_MG / (std_M1 + eps)


def dr_grpo(rewards_MG, *, eps, std_ddof):
  """A_i = r_i - mean_G r (no std division); ``eps``/``std_ddof`` unused (uniform signature)."""
  del eps, std_ddof
  chex.assert_rank(rewards_MG, 2)
  return rewards_MG - jnp.mean(rewards_MG, axis=-1, keepdims=True)


def rloo(rewards_MG, *, eps, std_ddof):
  """Leave-one-out baseline A_i = r_i - (sum_j r_j - r_i) / (G - 1); needs G >= 2."""
  del eps, std_ddof
  chex.assert_rank(rewards_MG, 2)
  g = rewards_MG.shape[-1]
  loo_mean_MG = (jnp.sum(rewards_MG, axis=-1, keepdims=True) - rewards_MG) / (g - 1)
  return rewards_MG - loo_mean_MG


ADVANTAGES = {'grpo': grpo, 'dr_grpo': dr_grpo, 'rloo': rloo}
SIGNS = ('both', 'positive', 'negative')


def keep_sign(adv_B, sign):
  """The advantages with the other sign set to 0: ``sign`` 'positive' keeps A > 0, 'negative'
  keeps A < 0, 'both' keeps everything (the array itself)."""
  if sign not in SIGNS:
    raise ValueError(f'advantage sign={sign!r}; valid: {", ".join(SIGNS)}')
  if sign == 'both':
    return adv_B
  keep = adv_B > 0 if sign == 'positive' else adv_B < 0
  return jnp.where(keep, adv_B, 0.0)


def _check_args(name, rewards_B, group_size, eps, std_ddof):
  if name not in ADVANTAGES:
    raise ValueError(f'unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGES)}')
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f'group_size={group_size!r} must be a positive int')
  if jnp.ndim(rewards_B) != 1:
    raise ValueError(f'rewards must have shape [B], got shape {jnp.shape(rewards_B)}')
  b = jnp.shape(rewards_B)[0]
  if b == 0 or b % group_size:
    raise ValueError(f'batch size B={b} is not a positive multiple of group_size={group_size}')
  if name == 'rloo' and group_size < 2:
    raise ValueError(f"'rloo' needs group_size >= 2, got {group_size}")
  if std_ddof not in (0, 1):
    raise ValueError(f'std_ddof={std_ddof!r} is not valid; valid: [0, 1]')
  if name == 'grpo' and std_ddof >= group_size:
    raise ValueError(f'std_ddof={std_ddof} needs group_size > std_ddof, got {group_size}')
  if not eps >= 0:
    raise ValueError(f'eps={eps!r} must be >= 0')


def compute_advantages(name, rewards_B, *, group_size, eps=1e-6, std_ddof=0, batch_normalize=False):
  """Group-relative advantages of contiguous groups.

  Args:
    name: one of ``ADVANTAGES`` ('grpo', 'dr_grpo', 'rloo').
    rewards_B: [B] rewards, B = M * group_size, each group contiguous.
    group_size: G.
    eps: added to the std in 'grpo' and in batch normalisation.
    std_ddof: 0 (population std) or 1 (sample std) for 'grpo'.
    batch_normalize: divide by the batch std of the advantages afterwards.

  Returns:
    (adv_B, metrics): [B] float32 advantages (exactly 0 in zero-variance groups) and a flat dict
    of scalars: frac_zero_std, reward_mean, reward_std, adv_mean, adv_std, adv_abs_max.

  Raises:
    ValueError: unknown name, bad shape, B not divisible by group_size, invalid ddof/eps.
  """
  _check_args(name, rewards_B, group_size, eps, std_ddof)
  rewards_B = jnp.asarray(rewards_B, jnp.float32)
  rewards_MG = rewards_B.reshape(-1, group_size)
  constant_M = _group_is_constant(rewards_MG)
  adv_MG = ADVANTAGES[name](rewards_MG, eps=eps, std_ddof=std_ddof)
  adv_MG = jnp.where(constant_M[:, None], 0.0, adv_MG)
  adv_B = adv_MG.reshape(-1)
  if batch_normalize:
    scale = jnp.std(adv_B) + eps
    adv_B = adv_B / jnp.where(scale > 0, scale, 1.0)  # all-zero batch with eps=0 stays 0
  metrics = {
      'frac_zero_std': jnp.mean(constant_M.astype(jnp.float32)),
      'reward_mean': jnp.mean(rewards_B),
      'reward_std': jnp.std(rewards_B),
      'adv_mean': jnp.mean(adv_B),
      'adv_std': jnp.std(adv_B),
      'adv_abs_max': jnp.max(jnp.abs(adv_B)),
  }
  return adv_B, metrics
