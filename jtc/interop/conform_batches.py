"""The batches `jtc conform` puts a loss through: random ones and adversarial ones, in float64.

Each `Batch` holds log pi, log pi_old, the advantages (group-relative, from 0/1 rewards: GRPO's
(r - mean) / (std + 1e-6), 0 for a group of equal rewards), the mask and the group size; groups
of G rows are contiguous. The set (`make`):
  random          M groups of G, lengths 1..T, some rows near on-policy (|log r| ~ 1e-5, inside
                  GSPO's narrow clip) and some far (|log r| ~ 0.2)
  on-policy       log pi = log pi_old: every ratio 1 (the coefficients are -A x the aggregation
                  weight for every correct objective)
  heavy padding   T = 24 columns, rows of 1..3 tokens
  short and long  rows of one token beside rows of the full width
  equal rewards   one group whose rewards are all equal (A = 0) beside mixed ones
  extreme ratios  |log r| up to 6: ratios near 0 and in the hundreds
  long drift      long rows whose log-ratios drift slightly below 0 (a sequence's product of
                  ratios is far below 1 while each ratio is near 1)
The split checks cut the random and the short-and-long batches into micro-batches and ranks
that split groups (or keep them whole for objectives that couple a group's members).

No ratio sits within a hair of a clip boundary (`away_from_kinks`): there the gradient jumps,
and float32 (jtc's closed form) and float64 (the function under test) could fall on opposite
sides.

Dimension key (docs/dimensions.md): B rows, M groups, G group size, T completion length.
"""

import dataclasses

import numpy as np

from jtc import objectives


@dataclasses.dataclass
class Batch:
  """One batch: ``name``, logp_BT, old_logp_BT, adv_B, mask_BT (float64), group_size and, for
  token-weighted objectives, token_weights_BT."""
  name: str
  logp_BT: np.ndarray
  old_logp_BT: np.ndarray
  adv_B: np.ndarray
  mask_BT: np.ndarray
  group_size: int
  token_weights_BT: np.ndarray | None = None

  @property
  def shape(self):
    return self.mask_BT.shape

  def rows(self, idx, T=None):
    """The batch of rows ``idx`` (a micro-batch or a rank's shard), trimmed to ``T`` columns
    (default: its longest row)."""
    idx = np.asarray(idx)
    T = T or max(int(self.mask_BT[idx].sum(-1).max()), 1)
    tw = None if self.token_weights_BT is None else self.token_weights_BT[idx, :T]
    return Batch(self.name, self.logp_BT[idx, :T], self.old_logp_BT[idx, :T], self.adv_B[idx],
                 self.mask_BT[idx, :T], self.group_size, tw)


def advantages(rewards_MG):
  """GRPO's group advantages (r - mean) / (std + 1e-6), exactly 0 for a group of equal rewards."""
  r = np.asarray(rewards_MG, np.float64)
  adv = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
  return np.where((r.max(-1) == r.min(-1))[:, None], 0.0, adv).reshape(-1)


def boundaries(objective, hparams):
  """(token-level, sequence-level) ratios where ``objective`` switches its gradient."""
  hp = {**objectives.default_hparams(objective), **hparams}
  eps = hp.get('eps')
  lo, hi = (eps, eps) if eps is not None else (hp.get('eps_low'), hp.get('eps_high'))
  points = [1.0 - lo if lo is not None else None, 1.0 + hi if hi is not None else None]
  if hp.get('dual_clip_c') is not None:
    points.append(hp['dual_clip_c'])
  points = [p for p in points if p is not None and p > 0]  # cispo's eps_low = 1: no lower clip
  seq = objective.startswith(('gspo', 'dfpo'))
  return ([] if seq else points), (points if seq else [])


def away_from_kinks(log_r_BT, mask_BT, token_points, seq_points, *, margin=1e-3):
  """log-ratios moved off every token-level kink by a relative ``margin`` and every sequence
  ratio off the sequence-level kinks (which are narrow: GSPO's 3e-4) by margin / 30."""
  log_r = log_r_BT.copy()
  for p in token_points:
    near = np.abs(np.exp(log_r) - p) < margin * p
    log_r = np.where(near, np.log(p) + 2 * margin, log_r)
  n_B = np.maximum(mask_BT.sum(-1), 1)
  for p in seq_points:
    s_B = np.exp((log_r * mask_BT).sum(-1) / n_B)
    near_B = np.abs(s_B - p) < margin / 30 * p
    log_r = log_r + (near_B[:, None] * mask_BT) * (margin / 15)
  return log_r


def _batch(name, rng, *, M, G, lengths_B, T, scale_B, rewards_MG, drift=0.0):
  B = M * G
  mask = (np.arange(T)[None, :] < np.asarray(lengths_B)[:, None]).astype(np.float64)
  old = rng.uniform(-3.0, -0.05, (B, T))
  log_r = drift + rng.normal(0.0, 1.0, (B, T)) * np.asarray(scale_B)[:, None]
  return name, mask, old, log_r, advantages(rewards_MG)


def make(objective, hparams, *, seed=0, G=4):
  """The batches of the module docstring for ``objective`` (its kinks avoided)."""
  rng = np.random.default_rng(seed)
  M, T = 4, 10
  B = M * G
  rewards = lambda: rng.integers(0, 2, (M, G)).astype(float) + 0.1 * rng.normal(size=(M, G))
  near_far = lambda: np.where(rng.random(B) < 0.5, 1e-5, 0.2)
  equal = rewards()
  equal[1] = 1.0
  specs = [
      _batch('random', rng, M=M, G=G, lengths_B=rng.integers(1, T + 1, B), T=T, scale_B=near_far(),
             rewards_MG=rewards()),
      _batch('on-policy', rng, M=M, G=G, lengths_B=rng.integers(1, T + 1, B), T=T,
             scale_B=np.zeros(B), rewards_MG=rewards()),
      _batch('heavy padding', rng, M=M, G=G, lengths_B=rng.integers(1, 4, B), T=24,
             scale_B=near_far(), rewards_MG=rewards()),
      _batch('short and long', rng, M=M, G=G, lengths_B=np.where(np.arange(B) % 2, 16, 1), T=16,
             scale_B=near_far(), rewards_MG=rewards()),
      _batch('equal rewards', rng, M=M, G=G, lengths_B=rng.integers(1, T + 1, B), T=T,
             scale_B=near_far(), rewards_MG=equal),
      _batch('extreme ratios', rng, M=M, G=G, lengths_B=rng.integers(1, T + 1, B), T=T,
             scale_B=np.full(B, 3.0), rewards_MG=rewards()),
      _batch('long drift', rng, M=M, G=G, lengths_B=np.full(B, 40), T=40, scale_B=np.full(B, 0.02),
             rewards_MG=rewards(), drift=-0.05),
  ]
  token_points, seq_points = boundaries(objective, hparams)
  weighted = objectives.LOSSES[objective].token_weighted
  out = []
  for name, mask, old, log_r, adv in specs:
    if name == 'extreme ratios':
      log_r = np.clip(log_r, -6.0, 6.0)
    log_r = away_from_kinks(log_r, mask, token_points, seq_points)
    tw = rng.uniform(0.2, 2.0, mask.shape) if weighted else None
    out.append(Batch(name, old + log_r, old, adv, mask, G, tw))
  return out
