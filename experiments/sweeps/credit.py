"""The Cancellation Hypothesis's batching prediction (issue 54), confirmatory.

  python -m experiments.run batching               # GRPO, 16 fresh seeds 56-71
  python -m experiments.run credit_probe_explore   # the diagnoses on the same rollouts, seeds 0-7
  python -m experiments.run credit_probe           # the same, confirmatory, fresh seeds 72-87

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


# The credit probe (experiments/credit_probe.py): one step's second, off-policy mini-batch updated
# from the same parameters and Adam state by each objective, after 8 RL steps of GRPO.
PROBE_FIRST_SEED = 72  # 56-71: batching; 72-87 fresh
PROBE_OBJECTIVES = (('grpo', 'GRPO'), ('grpo_fix', 'GRPO-fix'), ('gspo', 'GSPO'),
                    ('dfpo_min_replace', 'DFPO (Min-Replace)'))
PROBE = (('probe.prompts', 16), ('probe.group_size', 8), ('probe.minibatches', 2),
         ('probe.max_new_tokens', 32), ('probe.learning_rate', 1e-4), ('probe.warm_steps', 8))
PROBE_SMOKE = (('probe.prompts', 4), ('probe.group_size', 4), ('probe.minibatches', 2),
               ('probe.max_new_tokens', 12), ('probe.learning_rate', 1e-4), ('probe.warm_steps', 1))
DIAGNOSES_PREDICTION = (
    'Token Gradient Cancellation (arXiv 2604.13088): non-cancellation is the structural norm '
    'of a coupled / asymmetric objective off-policy, and the decoupled one removes it: on the '
    'same rollouts and parameters the tokens shared by positive and negative rollouts keep a '
    'larger residual under GSPO than under DFPO, and under GRPO than under GRPO-fix (arm - '
    'baseline > 0). The Cancellation Hypothesis (arXiv 2605.08666): opposing signals on such '
    'tokens cancel through the coupling of identical tokens in critic-free RL whatever the '
    'clip: no difference (=).')


def _probe(name, smoke, first_seed, description):
  runs = tuple(
      Run(n, n, label, (('loss.name', n),))
      for n, label in (PROBE_OBJECTIVES[2:] if smoke else PROBE_OBJECTIVES))
  return make_sweep(
      name, smoke, runs=runs, baseline='GSPO', num_steps=1, engine='probe',
      shared=PROBE_SMOKE if smoke else PROBE, seeds=1 if smoke else
      (8 if first_seed == 0 else confirm.SEEDS), first_seed=0 if smoke else first_seed,
      description=description, curve_keys=('credit/contested_residual', 'flip/boosted_gap'),
      tables=(Table(
          'Cancellation residual on tokens shared by positive and negative rollouts '
          '(sum |own + same-id| / sum (|own| + |same-id|))', 'final:credit/contested_residual',
          digits=4, prediction=DIAGNOSES_PREDICTION),
              Table('Boosted share, positive - negative rollouts (exact re-score)',
                    'final:flip/boosted_gap', digits=3),
              Table('Flipped tokens (suppressed in positive, boosted in negative rollouts)',
                    'final:flip/flipped', digits=3),
              Table('Same-id share of the coupling', 'final:credit/same_share_of_coupling',
                    digits=3),
              Table('Low-confidence share of the same-id coupling, minus their share of tokens',
                    'final:credit/same_low_conf_excess', digits=3),
              Table('Coupling against the own term (sum |same + other| / sum |own|)',
                    'final:credit/coupling_to_own', digits=3),
              Table('First-order error against the exact change (relative)',
                    'final:credit/first_order_rel_error', digits=4),
              Table('FADE sign balance m_S / (m_S + m_F)', 'final:mass/sign_balance', digits=4),
              Table('Trajectories switched off by the clip', 'final:credit/loss_frac_traj_gated',
                    digits=3)))


def credit_probe_explore(smoke=False):
  return _probe(
      'credit_probe_explore', smoke, 0,
      'Exploratory (seeds 0-7): token flipping, coupling and gradient mass of GRPO, '
      'GRPO-fix, GSPO and literal DFPO on the same off-policy mini-batch, after 8 RL '
      'steps of GRPO; checks the instruments before the confirmatory probe.')


def credit_probe(smoke=False):
  return _probe(
      'credit_probe', smoke, PROBE_FIRST_SEED,
      'Confirmatory (fresh seeds 72-87): the Diagnoses claims and the descriptive '
      'checks of experiments/sweeps/claims.py on the same rollouts.')


SWEEPS = {
    'batching': batching,
    'credit_probe_explore': credit_probe_explore,
    'credit_probe': credit_probe
}
