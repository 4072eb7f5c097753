"""The rollout-training mismatch split by the tokens' policy lag (partial rollouts, `jtc.rl.partial`).

With `rollout.max_decode_steps` a trained row may hold tokens drawn by several policy versions:
its sampler log-prob of each token is under the version that drew it (`Rollout.versions_BT`,
the ledger's `policy_version_BT`), while the behaviour pass scores every token under the
current sampling policy. So delta_t = log pi_train - log pi_sampler (`corrections.log_ratio`)
mixes the numerical mismatch of the sampler and the trainer (lag 0) with the change of the
policy since the token was drawn (lag k >= 1). `by_lag` gives the step's `mismatch/*` metrics
(`corrections.mismatch_metrics`) on the tokens of each lag bucket: 0 (drawn by the current
policy), 1, and 2+ (two or more versions back), with the share of the real tokens in it; the
trainer logs them as `mismatch/lag<k>/<metric>` (docs/mismatch.md).

Dimension key (docs/dimensions.md): B rows, T completion tokens.
"""

import numpy as np

from jtc.objectives import corrections

NO_VERSION = -1  # versions_BT where there is no token (`jtc.rl.partial.NO_VERSION`)
BUCKETS = ('0', '1', '2+')  # lag_BT values 0, 1, 2


def lag_BT(versions_BT, version: int) -> np.ndarray:
  """[B, T] int32: the versions between the policy ``version`` that scores the tokens and the
  one that drew each (``version`` - ``versions_BT``) as its `BUCKETS` index (2: two or more),
  -1 where there is no token. A token drawn after ``version`` is a ValueError."""
  versions_BT = np.asarray(versions_BT)
  real = versions_BT != NO_VERSION
  lag = np.where(real, version - versions_BT, 0)
  if np.any(lag < 0):
    raise ValueError(f'a token of version {int(versions_BT[real].max())} is newer than the '
                     f'scoring policy version {version}')
  return np.where(real, np.minimum(lag, len(BUCKETS) - 1), -1).astype(np.int32)


def by_lag(train_logps_BT, sampler_logps_BT, mask_BT, lag_BT, *, cap=2.0) -> dict:
  """{'lag<k>/<metric>': float} of `corrections.mismatch_metrics` on the real tokens (mask_BT >
  0) of each lag bucket k (`lag_BT`'s values, `BUCKETS`) that has any, and 'lag<k>/tokens': the
  share of the real tokens in bucket k (every bucket)."""
  mask_BT, lag_BT = np.asarray(mask_BT) > 0, np.asarray(lag_BT)
  n = max(int(mask_BT.sum()), 1)
  out = {}
  for k, name in enumerate(BUCKETS):
    in_k_BT = mask_BT & (lag_BT == k)
    out[f'lag{name}/tokens'] = float(in_k_BT.sum() / n)
    if in_k_BT.any():
      metrics = corrections.mismatch_metrics(np.asarray(train_logps_BT, np.float32),
                                             np.asarray(sampler_logps_BT, np.float32),
                                             in_k_BT.astype(np.int32), cap=cap)
      out.update({f'lag{name}/{m}': float(v) for m, v in metrics.items()})
  return out
