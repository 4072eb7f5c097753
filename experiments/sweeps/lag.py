"""The policy-lag axis (issue 38): rollouts from the policy of k steps ago, as asynchronous RL
systems (verl fully-async, prime-rl, slime, AReaL) produce them; the other source of off-policy
data besides PPO epochs.

  python -m experiments.run policy_lag      # exploratory, seeds 0-7

k = 0, 1, 2, 4 (`config.rollout.policy_lag`, ratios against the lagged behaviour policy) for
GSPO and DFPO (Min-Replace) under both readings of GSPO's clip, at the table1_confirm setting
(lr 1e-4, 80 RL steps of 16 prompts x G = 8 in 2 mini-batches). Exploratory: its tables are
shown with the paper's sign, never as a verdict.
"""

from experiments.sweeps.base import (BETTER, DFPO_GATED, DFPO_LABELS, DFPO_MIN, EVAL_CRN, FINAL_AVG,
                                     GSPO, Table, at, make_sweep, num_steps_of, predicted,
                                     shared_overrides)

LAGS = (0, 1, 2, 4)
PREDICTION = ('paper App. B / D: DFPO differs from GSPO only off-policy and gains more the '
              'further off-policy the updates are; a policy lag puts every update of a step '
              'off-policy by k steps, so DFPO - GSPO should be > 0 and grow with k.')


def policy_lag(smoke=False):
  lags = (0, 2) if smoke else LAGS
  runs = tuple(
      at(r, f'lag={k}', ('optim.learning_rate', 1e-4), ('rollout.policy_lag', k))
      for k in lags
      for r in (GSPO, DFPO_MIN, DFPO_GATED))
  n = num_steps_of(smoke)
  return make_sweep(
      'policy_lag', smoke, runs=runs, baseline='GSPO',
      shared=shared_overrides(n, *EVAL_CRN, diagnostics_every=0),
      description=('Exploratory policy-lag axis: rollouts sampled with the parameters of k = '
                   f'{", ".join(map(str, lags))} steps before, ratios against that behaviour '
                   'policy; GSPO vs DFPO (Min-Replace) literal and gated, lr 1e-4, 8 seeds.'),
      curve_keys=('accuracy', 'lag/log_ratio_std', 'frac_traj_gated', 'update_norm',
                  'clip_frac_high'),
      tables=(Table(
          'Held-out accuracy vs GSPO by policy lag', FINAL_AVG, unit='(%)', scale=100.0,
          by_group=True, prediction=PREDICTION,
          expect=tuple(x for x in predicted(runs, DFPO_LABELS, BETTER) if x[0][0] != 'lag=0')),
              Table('Spread of log pi_current - log pi_behaviour over tokens, mean over training',
                    'mean:lag/log_ratio_std', by_group=True, digits=4),
              Table('Trajectories whose gradient is switched off, mean over training',
                    'mean:frac_traj_gated', by_group=True),
              Table('Update norm ||Delta theta||, mean over training', 'mean:update_norm',
                    by_group=True, digits=5)))


SWEEPS = {'policy_lag': policy_lag}
