"""The rollout-training mismatch experiment (issue 30): does correcting the mismatch change the
paper's main comparison, DFPO (Min-Replace) - GSPO?

  python -m experiments.run mismatch

Mismatch axis: none (the sampler and the trainer compute the same distribution up to float
rounding), a top-p 0.9 sampler (its log-probs are of the renormalised nucleus; the trainer's of
the full distribution), a bfloat16 sampler against the float32 trainer. Correction axis: none,
tis, mis (`jtc.objectives.corrections`, cap 2). With no mismatch the corrections act on ratios of
1 +- 1e-6 and are not run. lr 1e-4, 80 steps, 8 seeds (0-7), avg@16 on 500 held-out problems.
Exploratory: its claims (claims.py) are reported with the claims-table statistics, no headline.
"""

from experiments.sweeps import confirm
from experiments.sweeps.base import (DFPO_MIN, FINAL_AVG, GSPO, SEEDS, Table, at, make_sweep,
                                     num_steps_of, shared_overrides)

TOP_P = (('rollout.sampling.top_p', 0.9),)
BF16 = (('rollout.sampler_dtype', 'bfloat16'),)
GROUPS = (('none', ()), ('top-p', TOP_P), ('top-p,tis', TOP_P + (('rollout.correction', 'tis'),)),
          ('top-p,mis', TOP_P + (('rollout.correction', 'mis'),)), ('bf16', BF16),
          ('bf16,tis', BF16 + (('rollout.correction', 'tis'),)),
          ('bf16,mis', BF16 + (('rollout.correction', 'mis'),)))
SMOKE_GROUPS = (GROUPS[0], GROUPS[2])


def mismatch(smoke=False):
  runs = tuple(
      at(r, g, confirm.LR, *ov)
      for g, ov in (SMOKE_GROUPS if smoke else GROUPS)
      for r in (GSPO, DFPO_MIN))
  n = num_steps_of(smoke)
  return make_sweep(
      'mismatch', smoke, seeds=1 if smoke else SEEDS,
      shared=shared_overrides(n, *(() if smoke else confirm.EVAL)),
      description=('Rollout-training mismatch x correction on DFPO (Min-Replace) - GSPO at lr '
                   '1e-4: no mismatch, a top-p 0.9 sampler, a bfloat16 sampler; corrections none, '
                   'tis, mis (cap 2). 8 seeds.'), runs=runs, baseline='GSPO',
      curve_keys=('reward_mean', 'accuracy', 'mismatch/mean_abs', 'mismatch/mean',
                  'correction/frac_truncated', 'correction/frac_masked'),
      tables=(Table('Held-out accuracy vs GSPO by mismatch and correction', FINAL_AVG, unit='(%)',
                    scale=100.0, by_group=True),
              Table('Mismatch: mean |log pi_train - log pi_sampler| per token, mean over training',
                    'mean:mismatch/mean_abs', by_group=True, digits=5),
              Table('Tokens the correction truncated, mean over training',
                    'mean:correction/frac_truncated', by_group=True, digits=4),
              Table('Tokens the correction masked, mean over training',
                    'mean:correction/frac_masked', by_group=True, digits=4)))
