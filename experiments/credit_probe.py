"""The credit probe (issue 54): the two papers' diagnoses measured on the same rollouts.

  python -m experiments.run credit_probe_explore   # exploratory, seeds 0-7
  python -m experiments.run credit_probe           # confirmatory, fresh seeds 72-87

Per seed (`jtc.analysis.credit_step.probe`): the shipped policy trained for a few RL steps of
GRPO (whole groups, 2 mini-batches, AdamW on the 80-step schedule), then one more step's
rollouts; its first mini-batch is updated with GRPO, and its second, off-policy mini-batch is
updated from the same parameters and Adam state by each objective of the sweep. For each, the
token flipping of that update (exact), the coupling decomposition of every token's change under
the update's own AdamW preconditioning, and FADE's gradient mass. Each objective is a run of
the sweep and each seed writes one summary per run, in the layout of the training sweeps, so
the tables, claims and verdicts read them as they read any run (`experiments/run.py` calls
`run_probe` for a sweep with ``engine='probe'``).
"""

import os
import time

import numpy as np

from experiments import summaries as summaries_lib


def setting_of(sweep):
  """The probe's `credit_step.Setting` from the sweep's shared ('probe.<field>', value)s."""
  from jtc.analysis import credit_step  # pylint: disable=import-outside-toplevel
  fields = {k.split('.', 1)[1]: v for k, v in sweep.shared if k.startswith('probe.')}
  return credit_step.Setting(**fields)


def metrics_of(measured):
  """The scalars a summary keeps of one objective's `credit_step.measure` output."""
  s = measured['summary']
  out = {f'credit/{k}': v for k, v in s.items()}
  # Identical tokens carry most of the coupling (> 1/2), and low-confidence ones more of it than
  # their share of the tokens: the Cancellation Hypothesis's "primarily between identical tokens
  # that are both predicted with low confidence", as excesses over those baselines.
  out['credit/same_share_excess'] = s['same_share_of_coupling'] - 0.5
  out['credit/same_low_conf_excess'] = s['same_low_conf_share'] - s['low_conf_token_share']
  out.update({f'flip/{k}': float(v) for k, v in measured['flip'].items()})
  out.update({f'mass/{k}': v for k, v in measured['mass'].items()})
  for k in ('frac_traj_gated', 'coef_mass_vs_gspo', 'clip_frac_high', 'clip_frac_low'):
    out[f'credit/loss_{k}'] = measured['loss_metrics'][k]
  return {k: float(v) for k, v in out.items() if np.isfinite(v)}


def run_probe(sweep, *, seeds, first_seed, results_dir, replace=False):
  """Every seed's probe not yet summarised; returns {run_id: (status, detail)} as
  `schedule.run_sweep` does."""
  from jtc.analysis import credit_step  # pylint: disable=import-outside-toplevel
  from jtc.data import tasks  # pylint: disable=import-outside-toplevel
  from jtc.models import bundles  # pylint: disable=import-outside-toplevel
  from jtc.rl import rollout  # pylint: disable=import-outside-toplevel
  from experiments import schedule  # pylint: disable=import-outside-toplevel
  specs = schedule.make_specs(sweep, seeds, first_seed)
  by_seed = {}
  for spec in specs:
    by_seed.setdefault(spec.seed, []).append(spec)
  setting = setting_of(sweep)
  bundle = bundles.load_policy_bundle('base')
  task = tasks.get_task('arithmetic')
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=setting.prompt_width)
  results = {}
  for seed, seed_specs in sorted(by_seed.items()):
    paths = [summaries_lib.summary_path(results_dir, s) for s in seed_specs]
    if not replace and all(os.path.exists(p) for p in paths):
      results.update({s.run_id: ('skipped', '') for s in seed_specs})
      continue
    t0 = time.time()
    losses = tuple(dict(s.run.overrides)['loss.name'] for s in seed_specs)
    try:
      out = credit_step.probe(bundle.model_config, bundle.params, gen, task, setting, seed,
                              objectives_=losses)
    except Exception as e:  # pylint: disable=broad-except
      results.update({s.run_id: ('failed', f'{type(e).__name__}: {e}') for s in seed_specs})
      continue
    wall = time.time() - t0
    for spec, name, path in zip(seed_specs, losses, paths):
      record = {'step': sweep.num_steps, **metrics_of(out[name])}
      summary = summaries_lib.make_summary(
          spec, 'in-process (experiments/credit_probe.py)', [record], wall_time_s=wall,
          command=['python', '-m', 'experiments.run', sweep.name, f'--first-seed={seed}'])
      summaries_lib.write_json(path, summary)
      results[spec.run_id] = ('ok', '')
    print(f'[credit_probe seed {seed}] {len(losses)} objectives in {wall:.0f} s', flush=True)
  return results
