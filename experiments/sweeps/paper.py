"""The exploratory sweeps: the papers' tables at CPU scale on seeds 0-7 (the runs that chose the
confirmatory settings, experiments/sweeps/confirm.py).

A Sweep is a list of runs (a method config + `--config.key=value` overrides), the row that the
others are compared with (`baseline`, paired by seed), the tables to print and the curves to
plot. `experiments/run.py` launches every run x seed and builds the tables from per-run
summaries.

Compute matching. Inside a comparison every run uses the same `num_steps`, `prompts_per_step`,
`group_size`, `max_new_tokens`, `ppo_epochs` and `minibatch_prompts`, so the optimiser update
steps, the rollouts per prompt and the *slots* for generated tokens (steps x B x T) are equal;
the tokens actually generated differ with response length and are reported per run
(`compute/generated_tokens`). We do not stop on `token_budget`, which would equalise tokens but
break the equal-update-steps constraint. `offpolicy` changes `minibatch_prompts` and
`ppo_epochs` on purpose (that is its axis): its comparisons are between methods within one
setting (one group), never across settings. DAPO's dynamic sampling is off in the `delta` sweep
(as in the DelTA paper), so every method sees one rollout batch per step.

Statistics. Every sweep that states a verdict runs SEEDS = 8 seeds (an exact sign-flip test on
8 paired seeds can reach p = 0.0078; on 5 it cannot go below 0.0625), and every table that
compares with a paper carries the paper's prediction (`Table.prediction`), committed before the
sweep ran (experiments/report.py: verdict rules).

Runs shared between sweeps. A run is identified by its settings: `mechanism`, `table2`, the
lr=1e-4, mb=2 column of `offpolicy` and the G=8 column of `table4` are the `table1` runs (same
config, same overrides in the same order), so they are reused, not re-run.

Sizing. `num_steps` is the single knob of a sweep (`--num-steps` overrides it; results of a
resized sweep go to experiments/results/scratch/). `estimate_seconds` uses the per-run cost
measured with `--jobs 2` on the 2-core machine, about 60-75 machine-seconds per 80-step run
including start-up, compilation and two evaluations.
"""

from experiments.sweeps.base import (BETTER, LOWER, predicted, DFPO_GATED, DFPO_LABELS, DFPO_MIN,
                                     FINAL_AVG, GATED, GRPO, GRPO_FIX, GSPO, LEARNING_RATES, Run,
                                     SEEDS, Table, at, lr_runs, make_sweep, num_steps_of,
                                     shared_overrides)

TABLE1_RUNS = (GSPO, DFPO_MIN, DFPO_GATED, GRPO, GRPO_FIX)
TABLE1_PREDICTION = ('paper Table 1 (AIME25 avg@32, Qwen3-32B): DFPO (Min-Replace) 82.5 > GSPO '
                     '76.9, and GRPO-fix 80.6 > GRPO 76.9: every decoupled objective above its '
                     'coupled / asymmetric counterpart, at equal compute.')


def table1(smoke=False):
  runs = lr_runs(TABLE1_RUNS, smoke)
  return make_sweep(
      'table1',
      smoke,
      description=('Paper Table 1: held-out avg@k after compute-matched RL from the same base '
                   'policy, at three peak learning rates (1e-4, the best DFPO rate of the first '
                   'stepsize control; the default 2e-4; 5e-5, added when every method did best '
                   'at 1e-4), with DFPO under both readings of '
                   "GSPO's clip (literal Eq. 68: no trajectory is switched off; gated: GSPO's "
                   'gating kept, Theorem C.1). 8 seeds.'),
      runs=runs,
      baseline='GSPO',
      tables=(Table('Held-out accuracy vs GSPO (Table 1), by learning rate', FINAL_AVG, unit='(%)',
                    scale=100.0, by_group=True, prediction=TABLE1_PREDICTION, paper=tuple(
                        (f'lr={n}', 'DFPO +5.6, GRPO-fix +3.7') for n, _ in LEARNING_RATES),
                    expect=predicted(runs, DFPO_LABELS + ('GRPO-fix',), BETTER)),
              Table('Held-out accuracy: GRPO-fix vs GRPO (symmetric clip), by learning rate',
                    FINAL_AVG, unit='(%)', scale=100.0, by_group=True, baseline='GRPO',
                    rows=('GRPO', 'GRPO-fix'), prediction=TABLE1_PREDICTION, paper=tuple(
                        (f'lr={n}', '+3.7') for n, _ in LEARNING_RATES),
                    expect=predicted(runs, ('GRPO-fix',), BETTER)),
              Table(
                  'Effective step: |coefficient| mass relative to GSPO on the same '
                  'mini-batch, mean over training', 'mean:coef_mass_vs_gspo', by_group=True),
              Table('Trajectories whose gradient is switched off, mean over training',
                    'mean:frac_traj_gated', by_group=True),
              Table('Policy change per update: k3 KL(behaviour || updated), mean over training',
                    'mean:approx_kl', unit='(x 1e-5)', scale=1e5, by_group=True)),
  )


def mechanism(smoke=False):
  """The diagnostics of the table1 runs (reused): measured at the off-policy mini-batches."""
  runs = lr_runs(TABLE1_RUNS, smoke)
  pred = ('paper Sec. 6.1 / Prop. 3.1: the decoupled objectives (DFPO, GRPO-fix) leave a '
          'smaller net gradient on the tokens the whole group shares (diag/shared_net_share), '
          'lower Asym (Eq. 23) and less gradient energy on high-frequency tokens (Eq. 24) '
          'than GSPO (resp. GRPO).')
  return make_sweep(
      'mechanism',
      smoke,
      description=('Paper Sec. 6.1 mechanism diagnostics over training, from the table1 runs: '
                   'the shared-token net gradient and residual (Prop. 3.1), Asym (Eq. 23 with '
                   "Eq. 14's weights), high-frequency Energy (Eq. 24), all measured where the "
                   'update is off-policy (every mini-batch after the first of a step).'),
      runs=runs,
      baseline='GSPO',
      curve_keys=('diag/shared_net_share', 'diag/shared_residual', 'asym', 'diag/energy_b0',
                  'coef_mass_vs_gspo', 'entropy'),
      tables=(Table('Net gradient on whole-group-shared tokens / total (diag/shared_net_share)',
                    'mean:diag/shared_net_share', by_group=True, prediction=pred,
                    expect=predicted(runs, DFPO_LABELS + ('GRPO-fix',), LOWER), digits=4),
              Table('The same, GRPO-fix vs GRPO', 'mean:diag/shared_net_share', by_group=True,
                    baseline='GRPO', rows=('GRPO', 'GRPO-fix'), prediction=pred,
                    expect=predicted(runs, ('GRPO-fix',), LOWER), digits=4),
              Table('Asym (Eq. 23), mean over training', 'mean:asym', by_group=True,
                    prediction=pred, expect=predicted(runs, DFPO_LABELS, LOWER)),
              Table('High-frequency Energy (Eq. 24, diag/energy_b0), mean over training',
                    'mean:diag/energy_b0', by_group=True, prediction=pred,
                    expect=predicted(runs, DFPO_LABELS, LOWER))),
  )


def table2(smoke=False):
  """Compute to a reward threshold and Jitter2, from the table1 runs (reused)."""
  runs = tuple(r for r in lr_runs((GSPO, DFPO_MIN, DFPO_GATED), smoke))
  pred = ('paper Table 2 / Fig. 2: DFPO reaches a fixed training-reward threshold with less '
          'compute (0.91x GSPO) and its reward curve is smoother (Jitter2 lower, Eq. 21).')
  expect = lambda op: predicted(runs, DFPO_LABELS, op)
  return make_sweep(
      'table2',
      smoke,
      description=(
          'Paper Table 2 / Figure 2: generated tokens to reach a training-reward '
          'threshold (difference from GSPO, per learning rate) and Jitter2 (Eq. 20) of the per-step '
          'reward; the table1 runs. Thresholds fixed before the run: 0.60 and 0.65 '
          '(5-step trailing mean; jtc.analysis.curves.compute_at_threshold).'),
      runs=runs,
      baseline='GSPO',
      plot_x='compute/generated_tokens',
      tables=tuple(
          Table(f'Generated tokens to reach training reward {thr:.2f}', 'compute_at:reward_mean',
                threshold=thr, by_group=True, unit='(tokens)', digits=0, prediction=pred,
                expect=expect(LOWER)) for thr in (0.60, 0.65)) +
      (Table('Jitter2 of the reward curve (Eq. 20-21)', 'jitter2:reward_mean', by_group=True,
             prediction=pred, expect=expect(LOWER)),),
  )


def table3(smoke=False):
  """Table 3 ablations at lr 1e-4 (DFPO and GSPO rows are the table1 runs)."""
  lr = ('optim.learning_rate', 1e-4)
  no_sg = Run('dfpo_no_stopgrad', 'dfpo_min_replace', 'DFPO (no stop-grad)',
              (('loss.hparams.stop_gradient', False),))
  scaled = Run('dfpo_scale_0.5', 'dfpo_min_replace', 'DFPO (scale by 0.5)',
               (('loss.hparams.global_scale', 0.5),))
  scaled_gated = Run('dfpo_scale_0.5_gated', 'dfpo_min_replace', 'DFPO (scale by 0.5, gated)',
                     (('loss.hparams.global_scale', 0.5),) + GATED)
  runs = tuple(
      at(r, 'lr=1e-4', lr) for r in (GSPO, DFPO_MIN, DFPO_GATED, no_sg, scaled, scaled_gated))
  pred = ('paper Table 3: DFPO without stop-gradient (75.6) and DFPO scaled by 0.5 (75.1) '
          'are below DFPO (82.5); "not solely a smaller effective step size".')
  return make_sweep(
      'table3',
      smoke,
      description=('Paper Table 3 at peak learning rate 1e-4: DFPO (Min-Replace) without the '
                   'stop-gradient on the transform, and with the transform replaced by a global '
                   "0.5 scale, under both readings of GSPO's clip (gated: exactly 0.5 x GSPO's "
                   'gradient). Baseline: DFPO (Min-Replace), literal.'),
      runs=runs,
      baseline='DFPO (Min-Replace)',
      tables=(Table(
          'Held-out accuracy vs DFPO (Table 3)', FINAL_AVG, unit='(%)', scale=100.0, by_group=True,
          prediction=pred, paper=(('lr=1e-4', 'no stop-grad -6.9, scale -7.4'),),
          expect=predicted(runs, ('DFPO (no stop-grad)', 'DFPO (scale by 0.5)'), LOWER) +
          predicted(runs, ('GSPO',), LOWER)),
              Table('The scaled rows against gated DFPO', FINAL_AVG, unit='(%)', scale=100.0,
                    by_group=True, baseline='DFPO (Min-Replace, gated)',
                    rows=('DFPO (Min-Replace, gated)', 'DFPO (scale by 0.5, gated)'),
                    prediction=pred, expect=predicted(runs, ('DFPO (scale by 0.5, gated)',),
                                                      LOWER)),
              Table('Effective step relative to GSPO, mean over training', 'mean:coef_mass_vs_gspo',
                    by_group=True)),
  )


OFFPOLICY = (
    ('mb=1', (('optim.minibatch_prompts', 16),)),  # one update: on-policy
    ('mb=2', ()),  # the table1 runs
    ('mb=4', (('optim.minibatch_prompts', 4),)),  # added after the others ran (issue 17 asks 1-8)
    ('mb=8', (('optim.minibatch_prompts', 2),)),
    ('mb=2,epochs=2', (('optim.ppo_epochs', 2),)))
# The smoke config has 2 prompts per step and 1 per mini-batch, so its default is mb=2 too.
SMOKE_OFFPOLICY = (('mb=1', (('optim.minibatch_prompts', 2),)), ('mb=2', ()))


def offpolicy(smoke=False):
  """How far off-policy the updates are: mini-batches per step and PPO epochs, at lr 1e-4."""
  lr = ('optim.learning_rate', 1e-4)
  runs = tuple(
      at(r, group, lr, *ov)
      for group, ov in (SMOKE_OFFPOLICY if smoke else OFFPOLICY)
      for r in ((GSPO, DFPO_MIN) if smoke else (GSPO, DFPO_MIN, DFPO_GATED)))
  pred = ('paper App. B / D: DFPO differs from GSPO only off-policy (on-policy every ratio is 1 '
          'and the transforms are the identity), so DFPO - GSPO should be 0 at mb=1 and '
          'grow in the paper\'s direction (DFPO > GSPO) as updates go further off-policy.')
  return make_sweep(
      'offpolicy',
      smoke,
      description=('The off-policy axis at peak learning rate 1e-4: mini-batches per RL step '
                   '(mb=1: one update per step, exactly on-policy; 2: the default and the '
                   'table1 runs; 4; 8) and two PPO epochs; GSPO vs DFPO (Min-Replace) under both '
                   'readings. mb=1 is a negative control: DFPO and GSPO must coincide there.'),
      runs=runs,
      baseline='GSPO',
      tables=(Table(
          'Held-out accuracy vs GSPO by off-policy setting', FINAL_AVG, unit='(%)', scale=100.0,
          by_group=True, prediction=pred,
          expect=tuple(e for e in predicted(runs, DFPO_LABELS, BETTER) if e[0][0] != 'mb=1')),
              Table('Effective step relative to GSPO, mean over training', 'mean:coef_mass_vs_gspo',
                    by_group=True),
              Table('Policy change per update: k3 KL(behaviour || updated), mean over training',
                    'mean:approx_kl', unit='(x 1e-5)', scale=1e5, by_group=True)),
  )


SEQUENCES_PER_STEP = 128
TABLE4_PREDICTION = (
    'paper Table 4 (AIME25 avg@32, Qwen3-32B): DFPO (Min-Replace) - GSPO is positive at '
    'every group size and grows with G (+3.1, +4.2, +5.6, +5.7 at G = 2, 4, 8, 16): more '
    'trajectories per group, more shared tokens whose gradients GSPO fails to cancel.')
TABLE4_PAPER = (('G=2', '+3.1'), ('G=4', '+4.2'), ('G=8', '+5.6'), ('G=16', '+5.7'))


def group_size_overrides(g, default, sequences=SEQUENCES_PER_STEP):
  """Overrides for group size ``g`` at ``sequences`` per step in 2 mini-batches; none at the
  config's own ``default`` G (so that group reuses the table1 / offpolicy runs)."""
  if g == default:
    return ()
  prompts = sequences // g
  return (('rollout.sampling.num_samples', g), ('rollout.prompts_per_step', prompts),
          ('optim.minibatch_prompts', prompts // 2))


def table4(smoke=False):
  """Table 4: DFPO - GSPO by group size at a fixed number of sequences per step, lr 1e-4."""
  lr = ('optim.learning_rate', 1e-4)
  # The smoke config runs 2 prompts x G = 4 = 8 sequences per step.
  gs, default, sequences = ((4, 2), 4, 8) if smoke else ((2, 4, 8, 16), 8, SEQUENCES_PER_STEP)
  sizes = tuple((f'G={g}', group_size_overrides(g, default, sequences)) for g in gs)
  methods = (GSPO, DFPO_MIN) if smoke else (GSPO, DFPO_MIN, DFPO_GATED)
  runs = tuple(at(r, group, lr, *ov) for group, ov in sizes for r in methods)
  return make_sweep(
      'table4',
      smoke,
      description=('Paper Table 4: DFPO (Min-Replace, both readings of GSPO\'s clip) - GSPO by '
                   f'group size G = 2, 4, 8, 16 at peak learning rate 1e-4. Every run generates '
                   f'{SEQUENCES_PER_STEP} sequences per step (prompts_per_step = '
                   f'{SEQUENCES_PER_STEP} / G) in 2 mini-batches, so token slots and update '
                   'steps are equal across G; G = 8 is the table1 setting (its runs are '
                   'reused).'),
      runs=runs,
      baseline='GSPO',
      tables=(Table('Held-out accuracy vs GSPO by group size (Table 4)', FINAL_AVG, unit='(%)',
                    scale=100.0, by_group=True, prediction=TABLE4_PREDICTION, paper=TABLE4_PAPER,
                    expect=predicted(runs, DFPO_LABELS, BETTER)),
              Table('Effective step relative to GSPO, mean over training', 'mean:coef_mass_vs_gspo',
                    by_group=True),
              Table('Trajectories whose gradient is switched off, mean over training',
                    'mean:frac_traj_gated', by_group=True),
              Table('Asym (Eq. 23), mean over training', 'mean:asym', by_group=True)),
  )


PHRASING = (('data.task', 'phrasing'), ('policy.init', 'phrasing'),
            ('rollout.sampling.max_new_tokens', 48), ('eval.sampling.max_new_tokens', 48))
DRIFT_STEPS = 400


def drift(smoke=False):
  """Reward-irrelevant drift and learning tax on the exactly-equivalent phrasing task."""
  n = num_steps_of(smoke, DRIFT_STEPS)
  shared = (('eval.every', 5 if smoke else 50), ('log.diagnostics_every', 1 if smoke else 10))
  runs = (GSPO, DFPO_MIN) if smoke else (GSPO, DFPO_MIN, GRPO_FIX, GRPO)
  exchangeable = tuple(r.label for r in runs if r in (DFPO_MIN, GRPO_FIX))
  pred_drift = ('paper Cor. 3.2 / Eq. 41 (App. A): with exchangeable token updates (DFPO, GRPO-'
                'fix, GRPO inside its clip) equivalent solutions keep their relative '
                'probability; sequence-coupled weights (GSPO) make the log-odds between them '
                'drift and the entropy over the equivalent set fall. On this task the phrasings '
                'are equally rewarded and equally easy, so: the exact phrasing entropy falls '
                'less (its change is larger) under DFPO and GRPO-fix than under GSPO.')
  pred_tax = ('paper Prop. 3.1 / App. E (learning tax): the tokens every completion of a group '
              'shares (the "Work: " scaffold) keep a net gradient under GSPO and none under the '
              'exchangeable objectives, so diag/shared_net_share is lower for DFPO and GRPO-fix '
              'than for GSPO.')
  # Cor. 3.2 in expectation: the log-odds of two equivalent phrasings moves one way across seeds,
  # or not. Only a pair that is exchangeable by construction ('The answer is' / 'The result is':
  # same first token, same length) has a change symmetric about 0 when nothing drifts
  # systematically, as the sign-flip test needs; a single log-share falls under any random walk
  # of the log-odds (log-softmax is concave), so testing it against 0 rejects far too often
  # (tests/experiments/test_experiments.py simulates both).
  logq = 'eval/probe/format_logq/'
  systematic = Table(
      "Systematic drift: change of the log-odds log q('answer') - log q('result'), against 0",
      f'change:{logq}answer - {logq}result', digits=3, against_zero=True)
  return make_sweep(
      'drift',
      smoke,
      num_steps=n,
      seeds=1 if smoke else SEEDS,
      shared=PHRASING + shared,
      description=('Drift between exactly equivalent solutions and the learning tax on shared '
                   'tokens, on the phrasing task (jtc/data/tasks/phrasing.py: identical reasoning, '
                   'then one of three equally long phrasings; every completion starts with the '
                   'scaffold "Work: ") from its own SFT base policy (jtc/assets/phrasing_policy), '
                   f'{n} RL steps at the default learning rate 2e-4. The phrasing entropy and '
                   'log-shares are exact (eval/probe/*: log-probs of the three correct solutions '
                   'of 64 fixed held-out problems), not sampled.'),
      runs=runs,
      baseline='GSPO',
      curve_keys=('eval/probe/format_entropy', f'{logq}answer - {logq}result',
                  'eval/probe/scaffold_logprob', 'diag/shared_net_share', 'diag/shared_energy',
                  'format/entropy', 'reward_mean'),
      tables=(Table('Change of the exact phrasing entropy over training (nats)',
                    'change:eval/probe/format_entropy', prediction=pred_drift, digits=4,
                    expect=tuple((l, BETTER) for l in exchangeable)),
              Table('Final exact phrasing entropy (nats; log 3 = 1.0986)',
                    'final:eval/probe/format_entropy', digits=4),
              Table('Net gradient on whole-group-shared tokens / total, mean over training',
                    'mean:diag/shared_net_share', prediction=pred_tax, digits=4, expect=tuple(
                        (l, LOWER) for l in exchangeable)),
              Table('Change of log pi(scaffold) over training',
                    'change:eval/probe/scaffold_logprob', digits=4),
              Table('Held-out accuracy', FINAL_AVG, unit='(%)', scale=100.0), systematic),
  )


DELTA_RUNS = (('full', 'DelTA'), ('no_normalization', 'w/o lambda-norm'),
              ('no_adaptive_gamma', 'w/o adaptive gamma'), ('select_top', 'Top-lambda tokens'),
              ('select_bottom', 'Bottom-lambda tokens'), ('select_random', 'Random 50% tokens'))


def delta(smoke=False):
  dapo = Run('dapo', 'dapo', 'DAPO')
  runs = (dapo,) + tuple(
      Run(f'delta_{a}', 'delta', lab, (('delta.ablation', a),)) for a, lab in DELTA_RUNS)
  if smoke:
    runs = tuple(r for r in runs if r.name in ('dapo', 'delta_full', 'delta_no_normalization',
                                               'delta_select_top', 'delta_select_random'))
  present = {r.label for r in runs}
  rows = lambda *labels: tuple(l for l in labels if l in present)
  pred = ('DelTA paper Table 3 / 4: DelTA > DAPO (+4.2 points averaged over four benchmarks); '
          'w/o lambda-norm (21.39) and w/o adaptive gamma (21.19) below DelTA (23.27).')
  pred_sel = ('DelTA paper Figure 3: training on the top-lambda half of the tokens beats the '
              'bottom-lambda half (which collapses); random 50% stays near DAPO.')
  return make_sweep(
      'delta',
      smoke,
      shared=shared_overrides(num_steps_of(smoke), ('dapo.dynamic_sampling', False),
                              ('dapo.overlong_buffer', 8)),
      description=('DelTA paper: DAPO vs DelTA, the two component ablations whose instrument was '
                   'fixed (w/o lambda-norm now trains on sum(lambda ppo) / N; the fixed gamma is '
                   'stated in units of E||v||^2), and Figure 3 hard selection of half of the '
                   'tokens of EACH advantage side by lambda. Dynamic sampling off for all methods '
                   '(as in the DelTA paper), overlong shaping on for all.'),
      runs=runs,
      baseline='DAPO',
      tables=(Table('DelTA vs DAPO (DelTA Table 3)', FINAL_AVG, unit='(%)', scale=100.0,
                    rows=('DAPO', 'DelTA'), prediction=pred,
                    paper=(('DAPO', '19.05'), ('DelTA', '23.27')), expect=(('DelTA', BETTER),)),
              Table(
                  'Components against full DelTA (DelTA Table 4)', FINAL_AVG, unit='(%)',
                  scale=100.0, baseline='DelTA', prediction=pred,
                  rows=rows('DelTA', 'w/o lambda-norm', 'w/o adaptive gamma'),
                  paper=(('DelTA', '23.27'), ('w/o lambda-norm', '21.39'), ('w/o adaptive gamma',
                                                                            '21.19')),
                  expect=(('w/o lambda-norm', LOWER), ('w/o adaptive gamma', LOWER))),
              Table('Token selection (DelTA Figure 3), against the random half', FINAL_AVG,
                    unit='(%)', scale=100.0, baseline='Random 50% tokens', prediction=pred_sel,
                    rows=rows('Random 50% tokens', 'Top-lambda tokens', 'Bottom-lambda tokens'),
                    expect=(('Top-lambda tokens', BETTER), ('Bottom-lambda tokens', LOWER))),
              Table('Token selection: training reward, last quarter', 'late_mean:reward_mean',
                    baseline='Random 50% tokens', prediction=pred_sel,
                    rows=rows('Random 50% tokens', 'Top-lambda tokens', 'Bottom-lambda tokens'),
                    expect=(('Top-lambda tokens', BETTER), ('Bottom-lambda tokens', LOWER)))),
  )
