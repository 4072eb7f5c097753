"""The Cancellation Hypothesis's batching prediction (issue 54), confirmatory.

  python -m experiments.run batching     # GRPO, 16 fresh seeds 56-71

The Cancellation Hypothesis (Cheng et al. 2026, arXiv 2605.08666): a token's change is driven in
good part by gradient coupling with identical tokens elsewhere in the same update, so opposing
signals cancel on tokens shared by positive and negative rollouts of a prompt; keeping a
prompt's rollouts in one update ("query-preserved mini-batching") encourages that cancellation
and balancing positive and negative rollouts per update ("reward-balanced batching") preserves
it; both, it reports, improve RLVR training. jtc's mini-batches are whole groups by default
(`optim.minibatch_order=group`); `shuffled` spreads a group's rollouts over the mini-batches.

GRPO (the paper's critic-free RL; its loss is row-separable, so a row order is meaningful) at the
table1_confirm setting (lr 1e-4, 80 RL steps of 16 prompts x G = 8 in 2 mini-batches: the second
update of every step is off-policy), avg@16 on 500 held-out problems with common random numbers.
Arms: whole groups per mini-batch, rows shuffled, rows reward-balanced, and whole groups trained
on the positive advantages only (the paper's control; exploratory). Seeds 56-71: no run used
them (seeds 0-7 chose jtc's settings, 8-39 ran earlier confirmatory sweeps, 40-55 are held for
best_vs_best). The claims (experiments/sweeps/claims.py, family 'Batching') and the papers'
predictions were written before any run.
"""

import dataclasses

from experiments.sweeps import confirm
from experiments.sweeps.base import (EVAL_CRN, FINAL_AVG, Run, Table, make_sweep, num_steps_of,
                                     shared_overrides)

FIRST_SEED = 56
LR = 1e-4
GROUP = 'GRPO (whole groups)'
SHUFFLED = 'GRPO (shuffled rows)'
BALANCED = 'GRPO (reward-balanced rows)'
POSITIVE = 'GRPO (positive only)'
ARMS = ((GROUP, (('optim.minibatch_order', 'group'),)),
        (SHUFFLED, (('optim.minibatch_order', 'shuffled'),)), (BALANCED, (('optim.minibatch_order',
                                                                           'reward_balanced'),)),
        (POSITIVE, (('optim.minibatch_order', 'group'), ('advantage.sign', 'positive'))))

CH_SETTING = 'Qwen-family models, math RLVR (the paper\'s numbers were not readable here)'
BATCHING_PREDICTION = (
    'Cancellation Hypothesis (arXiv 2605.08666): keeping a prompt\'s rollouts in one update '
    '(query-preserved mini-batching) and balancing positive and negative rollouts per update '
    '(reward-balanced batching) preserve the cancellation of shared tokens and improve RLVR '
    'training: whole groups > shuffled rows, reward-balanced rows > shuffled rows. (Token '
    'Gradient Cancellation predicts the same sign for whole groups: its Prop. 3.1 cancellation '
    'needs the whole group in one update; this claim does not tell the two apart.)')


def _runs():
  names = ('grpo_group', 'grpo_shuffled', 'grpo_reward_balanced', 'grpo_positive')
  return tuple(
      Run(name, 'grpo', label, (('optim.learning_rate', LR),) + overrides)
      for name, (label, overrides) in zip(names, ARMS))


def batching(smoke=False):
  n = num_steps_of(smoke)
  runs = _runs()
  if smoke:  # 2 prompts x G = 4 in 2 mini-batches: every order is meaningful
    runs = tuple(
        dataclasses.replace(r, overrides=r.overrides + (('optim.minibatch_prompts', 1),))
        for r in runs[:2])
  return make_sweep(
      'batching', smoke, runs=runs,
      baseline=SHUFFLED, shared=shared_overrides(n, *(() if smoke else confirm.EVAL),
                                                 *(() if smoke else EVAL_CRN), diagnostics_every=0),
      seeds=1 if smoke else confirm.SEEDS, first_seed=0 if smoke else FIRST_SEED,
      description=('Confirmatory batching test of the Cancellation Hypothesis: GRPO at lr 1e-4 '
                   'with whole groups per mini-batch, shuffled rows, reward-balanced rows, and '
                   'positive-only advantages (exploratory), 2 mini-batches per step, 16 fresh '
                   'seeds 56-71, avg@16 on 500 held-out problems.'),
      curve_keys=('accuracy', 'reward_mean', 'entropy', 'update_norm', 'approx_kl'),
      tables=(Table('Held-out accuracy vs shuffled rows', FINAL_AVG, unit='(%)', scale=100.0,
                    prediction=BATCHING_PREDICTION),
              Table('Policy entropy of the sampled tokens, mean over training', 'mean:entropy'),
              Table('Update norm ||Delta theta||, mean over training', 'mean:update_norm',
                    digits=5)))


SWEEPS = {'batching': batching}
