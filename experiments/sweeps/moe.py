"""A first look at a mixture-of-experts policy (issue 50): GRPO, GSPO and literal DFPO
(Min-Replace) on the tiny MoE base policy (`jtc/assets/moe_policy`, 8 experts of 192, 2 per
token; configs/sft_arith_moe.py), with and without routing replay.

  python -m experiments.run moe      # exploratory, seeds 0-7

`config.rollout.routing_replay` none vs behaviour (`jtc.rl.routing`): the behaviour pass and
every update route each completion token to the experts the sampler used. lr 1e-4, 80 RL steps
of 16 prompts x G = 8 in 2 mini-batches, as the dense sweeps. Reported: held-out accuracy, the
routing flip rate (completion tokens whose experts differ between the sampler and the trainer's
own router, in some layer) and the share of |log pi_train - log pi_sampler| on those tokens.
Exploratory only: no verdict; a claim it suggests is declared for fresh seeds with its family
before any run.
"""

from experiments.sweeps.base import (BETTER, DFPO_MIN, EVAL_CRN, FINAL_AVG, GRPO, GSPO, Table, at,
                                     make_sweep, num_steps_of, shared_overrides)

REPLAYS = ('none', 'behaviour')
PREDICTION = ('paper Table 1 (Qwen3-Next-80B-A3B, a MoE): DFPO > GSPO; GSPO was proposed because '
              'token-level ratios are unstable under MoE routing changes, which routing replay '
              'removes, so DFPO - GSPO should be > 0 with replay, and no smaller than without.')


def moe(smoke=False):
  runs = tuple(
      at(r, f'replay={mode}', ('policy.init', 'moe'), ('optim.learning_rate',
                                                       1e-4), ('rollout.routing_replay', mode))
      for mode in REPLAYS
      for r in (GRPO, GSPO, DFPO_MIN))
  n = num_steps_of(smoke)
  return make_sweep(
      'moe', smoke, runs=runs, baseline='GSPO',
      shared=shared_overrides(n, *EVAL_CRN, diagnostics_every=0),
      description=('Exploratory MoE look: GRPO, GSPO, literal DFPO (Min-Replace) on the tiny MoE '
                   'policy (8 experts, top-2), routing_replay none vs behaviour, lr 1e-4, '
                   '8 seeds.'),
      curve_keys=('accuracy', 'mismatch/routing_flip_rate', 'mismatch/routing_abs_delta_share',
                  'mismatch/mean_abs', 'router_aux'),
      tables=(Table('Held-out accuracy vs GSPO by routing replay', FINAL_AVG, unit='(%)',
                    scale=100.0, by_group=True, prediction=PREDICTION, expect=tuple(
                        ((f'replay={m}', DFPO_MIN.label), BETTER) for m in REPLAYS)),
              Table('Routing flip rate (sampler vs trainer experts), mean over training',
                    'mean:mismatch/routing_flip_rate', by_group=True, digits=4),
              Table(
                  'Share of |log pi_train - log pi_sampler| on flipped tokens, mean over training',
                  'mean:mismatch/routing_abs_delta_share', by_group=True, digits=3),
              Table('Mean |log pi_train - log pi_sampler|, mean over training',
                    'mean:mismatch/mean_abs', by_group=True, digits=5)))


SWEEPS = {'moe': moe}
