"""The exploratory mixture-of-experts sweep (issue 50, item 8): GRPO, GSPO and literal DFPO
(Min-Replace) on the tiny MoE base policy (`jtc/assets/moe_policy`, 8 experts, 2 per token),
each with `rollout.routing_replay` none and behaviour.

  python -m experiments.run moe --jobs 1      # exploratory, seeds 0-7

The mismatch source: a bfloat16 sampler against the float32 trainer (`rollout.sampler_dtype`,
the mismatch sweep's `bf16` setting). The router's logits are float32 on both sides, but its
input, the hidden state, is computed in bf16 by the sampler, so a token whose top-2 experts are
nearly tied can be routed to other experts than the trainer's router picks: a routing flip,
which routing replay (`behaviour`) removes from the behaviour pass and the updates. With a
float32 sampler the two sides differ only by the KV-cache's float rounding and flips are rare:
GSPO with a float32 sampler is the negative control (flip rate ~0).

Measured per step (`jtc.rl.routing`): `mismatch/routing_flip_rate` (completion tokens whose
experts differ in some layer between the sampler and the behaviour pass's own router; with
replay, the router's own choice on the replayed forward), `mismatch/routing_abs_delta_share`
(the share of sum |log pi_train - log pi_sampler| on those tokens) and `mismatch/mean_abs`.

Scale, sized to the clock of one sitting (it had to finish within about an hour on the shared
2-core machine, load average 8-10): a probe population (GSPO, bf16 sampler, replay behaviour, 8
seeds, 4 steps, an SFT-smoke MoE policy) took 6.0 min of wall time at 43% of one core: about
135 s of start-up and compilation, 45-60 s per evaluation of 256 problems x 4 and 25-40 s per RL
step. Hence NUM_STEPS = 16 RL steps (not the 80 of the confirmatory sweeps) and avg@4 on 128
held-out problems, evaluated at step 0 and at the end; lr 1e-4, 16 prompts x G = 8 per step in 2
mini-batches. Enough to measure the routing flips on the policy's own rollouts from the first
step on; too short for the accuracy differences between methods or replay settings to mean much.
Exploratory: its tables are shown with no prediction and no verdict; a claim they suggest is
declared for fresh seeds before it runs (experiments/results/moe.notes.md).
"""

import dataclasses

from experiments.sweeps.base import (DFPO_MIN, FINAL_AVG, GRPO, GSPO, SEEDS, Table, at, make_sweep,
                                     num_steps_of, shared_overrides)

NUM_STEPS = 16  # sized to the clock (module docstring)
EVAL = (('eval.problems', 128), ('eval.sampling.num_samples', 4), ('eval.batch_prompts', 16))
POLICY = (('policy.init', 'moe'), ('optim.learning_rate', 1e-4))
BF16 = (('rollout.sampler_dtype', 'bfloat16'),)
F32 = (('rollout.sampler_dtype', 'float32'),)
REPLAY = {'none': 'replay none', 'behaviour': 'replay behaviour'}
CONTROL = 'f32 sampler, replay none'
METHODS = (GSPO, DFPO_MIN, GRPO)  # run in this order: the most wanted first


def _run(method, label, *overrides):
  """``method`` in its own group (a row of every table), labelled by its sampler and replay."""
  return dataclasses.replace(at(method, method.label, *POLICY, *overrides), label=label)


def moe(smoke=False):
  methods = (GSPO,) if smoke else METHODS
  runs = tuple(
      _run(m, REPLAY[mode], *BF16, ('rollout.routing_replay', mode))
      for m in methods
      for mode in REPLAY)
  if not smoke:
    runs += (_run(GSPO, CONTROL, *F32, ('rollout.routing_replay', 'none')),)
  n = num_steps_of(smoke, NUM_STEPS)
  return make_sweep(
      'moe', smoke, num_steps=n, seeds=1 if smoke else SEEDS,
      shared=shared_overrides(n, *(() if smoke else EVAL), diagnostics_every=0),
      description=('Exploratory MoE sweep on the tiny MoE policy (8 experts, top-2): GRPO, GSPO, '
                   'DFPO (Min-Replace) with a bfloat16 sampler against the float32 trainer, '
                   'routing replay none vs behaviour; GSPO with a float32 sampler as the negative '
                   'control; lr 1e-4, 8 seeds (0-7).'), runs=runs, baseline=REPLAY['none'],
      curve_keys=('accuracy', 'reward_mean', 'mismatch/routing_flip_rate',
                  'mismatch/routing_abs_delta_share', 'mismatch/mean_abs'),
      tables=(Table('Held-out accuracy by method: replay behaviour vs none', FINAL_AVG, unit='(%)',
                    scale=100.0, by_group=True),
              Table(
                  'Routing flip rate (completion tokens whose experts differ in some layer), '
                  'mean over training', 'mean:mismatch/routing_flip_rate', by_group=True,
                  higher_is_better=False, digits=5),
              Table(
                  'Routing share of the mismatch (share of sum |log pi_train - log pi_sampler| '
                  'on flipped tokens), mean over training', 'mean:mismatch/routing_abs_delta_share',
                  by_group=True, higher_is_better=False, digits=4),
              Table('Mismatch: mean |log pi_train - log pi_sampler| per token, mean over training',
                    'mean:mismatch/mean_abs', by_group=True, higher_is_better=False, digits=5),
              Table('Training reward, mean over training', 'mean:reward_mean', by_group=True,
                    digits=3)))


SWEEPS = {'moe': moe}
