"""The vocabulary of the sweeps: a `Run` (a method config + overrides), a `Table` of a results
file, a `Sweep` (runs x seeds, the baseline, the tables), the method rows several sweeps share and
the helpers that build sweeps. Sizing: `estimate_seconds` uses the per-run cost measured with
`--jobs 2` on the 2-core machine, about 60-75 machine-seconds per 80-step run including
start-up, compilation and two evaluations."""

import dataclasses

SMOKE_STEPS = 3

FULL_STEPS = 80

# `estimate_seconds`: machine-seconds (wall time with both cores busy), measured (see above).
STEP_SECONDS = 0.7
STARTUP_SECONDS = 8.0
EVAL_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Run:
  """One row of a sweep: `configs/<config>.py` with `--config.<key>=<value>` overrides."""
  name: str  # unique, filesystem-safe id inside the sweep
  config: str  # method config name, e.g. 'gspo'
  label: str  # row label in the tables, e.g. 'DFPO (Min-Replace)'
  overrides: tuple = ()  # ((key, value), ...) on top of the sweep's shared overrides
  group: str = ''  # e.g. 'lr=1e-4'; comparisons are within a group


@dataclasses.dataclass(frozen=True)
class Table:
  """One results table. `metric` is '<extractor>:<metric key>' (see report.EXTRACTORS)."""
  title: str
  metric: str
  unit: str = ''  # column header suffix, e.g. '(%)'
  scale: float = 1.0  # multiply values for display (100 for accuracies)
  higher_is_better: bool = True
  normalize: bool = False  # Table 2: divide by the baseline's mean (ratio of means)
  threshold: object = None  # compute_at: a float, or 'auto' (see report.auto_threshold)
  by_group: bool = False  # one row per group (e.g. learning rate), one column per label
  rows: tuple = ()  # labels to show ('' = all runs of the sweep)
  paper: tuple = ()  # ((label or group, value string), ...) the paper's numbers
  expect: tuple = ()  # ((label, group or (group, label), '>' | '<'), ...): the
  # paper's direction vs the baseline ('>' = larger)
  baseline: str = ''  # label compared against; '' = the sweep's baseline
  against_zero: bool = False  # test every row's value against 0 (one-sample sign-flip), no
  # baseline: a systematic change in one direction across seeds
  prediction: str = ''  # the paper's prediction (metric, sign), written before the run
  digits: object = None  # decimals shown (None: 3 for ratios and raw values, else 1)

  def __post_init__(self):
    if self.against_zero and (self.normalize or self.by_group or self.expect):
      raise ValueError(f'table {self.title!r}: against_zero tests each row against 0; it takes '
                       'no normalize, by_group or expect')


@dataclasses.dataclass(frozen=True)
class Sweep:
  name: str
  description: str
  runs: tuple
  baseline: str  # label of the baseline run (per group when grouped)
  tables: tuple
  num_steps: int  # THE sizing knob
  seeds: int  # default number of seeds
  shared: tuple = ()  # ((key, value), ...) overrides applied to every run
  config_arg: str = ''  # '' | 'smoke'
  curve_keys: tuple = ('reward_mean', 'accuracy', 'entropy', 'asym', 'format/entropy',
                       'response_length')
  plot_x: str = 'step'  # or 'compute/generated_tokens'
  smoke: bool = False
  first_seed: int = 0  # seeds first_seed .. first_seed + seeds - 1 (confirmatory sweeps: 8)
  # 'train': every run x seed is a `python -m jtc.train` run; 'probe': the runs are measured in
  # process by experiments/credit_probe.py (one update per objective, no training run).
  engine: str = 'train'
  blocked: str = ''  # why it cannot run yet (experiments/run.py refuses it; tables still build)


KINDS = ('confirmatory', 'exploratory', 'check', 'descriptive')
SUBJECTS = ('paper', 'jtc')


@dataclasses.dataclass(frozen=True)
class Claim:
  """One comparison a verdict is given on: ``arm`` - ``baseline`` (run labels of ``sweep``, in
  ``group``) of ``metric`` ('<extractor>:<key>', as `Table.metric`), paired by seed, in units of
  ``scale`` x the metric (100: points of accuracy).

  family: the claims that answer one paper table or question (Holm corrects within it).
  kind: 'confirmatory' (fresh seeds, settings fixed in this file before they ran),
    'exploratory' (the runs that chose the settings; shown, never the headline), 'check' (an
    implementation check whose arms are identical by construction, e.g. DFPO = GSPO on-policy:
    listed apart, outside every multiplicity correction and every tally) or 'descriptive' (a
    declared threshold on one measured quantity, ``sesoi`` the threshold: judged alone, outside
    the corrections and the tallies).
  subject: whose account the claim tests: 'paper' (a paper's prediction) or 'jtc' (an account
    jtc wrote from its own results, e.g. the step-size account): only 'paper' claims are
    tallied as verdicts on the papers.
  baseline: '' compares ``arm`` against 0 (a quantity of one arm, e.g. a descriptive check).
  predicted: the predicted sign of arm - baseline: '>' / '<', '=' for no difference (a control,
    or an account that predicts none), '' where nothing is predicted.
  paper_delta: the paper's difference in the same units (None: not stated), measured in
    ``paper_setting`` (model, task, scale): sizes do not transfer across settings, so a verdict
    compares signs and equivalence, never this number.
  sesoi: the smallest effect size of interest, same units; ``sesoi_why`` justifies it.
  prediction: the paper's prediction in words, written before the runs.
  """
  name: str
  family: str
  sweep: str
  metric: str
  arm: str
  baseline: str
  group: str = ''
  kind: str = 'confirmatory'
  predicted: str = ''
  paper_delta: object = None
  paper_setting: str = ''
  sesoi: object = 1.0  # None: no equivalence test
  sesoi_why: str = ''
  scale: float = 100.0
  unit: str = 'points'
  prediction: str = ''
  threshold: object = None  # for a 'compute_at:' metric (see report.metric_value)
  # A difference of differences: (arm - baseline in group) - (minus[0] - minus[1] in minus[2]),
  # paired by seed (e.g. does a correction change DFPO - GSPO?).
  minus: tuple = ()
  note: str = ''  # what a reader must know about the runs (claims.md prints it under the table)
  subject: str = 'paper'

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'claim {self.name!r}: kind={self.kind!r}; valid: {", ".join(KINDS)}')
    if self.subject not in SUBJECTS:
      raise ValueError(f'claim {self.name!r}: subject={self.subject!r}; valid: '
                       f'{", ".join(SUBJECTS)}')
    if self.predicted not in ('>', '<', '=', ''):
      raise ValueError(
          f"claim {self.name!r}: predicted={self.predicted!r}; valid: '>', '<', '=', ''")
    if self.sesoi is not None and not self.sesoi > 0:
      raise ValueError(f'claim {self.name!r}: sesoi={self.sesoi!r} must be > 0 (or None)')


def estimate_seconds(sweep, *, seeds=None, step_seconds=STEP_SECONDS):
  """Machine-seconds for all runs x seeds under the sizing assumptions above."""
  seeds = seeds or sweep.seeds
  per_run = STARTUP_SECONDS + sweep.num_steps * step_seconds + 2 * EVAL_SECONDS
  return len(sweep.runs) * seeds * per_run


SEEDS = 8
# Issue 38: evaluations whose draws do not depend on the training batch (common random numbers
# across group sizes and settings). 16 prompts per evaluation call is what every earlier run with
# 16 prompts per step used, so those evaluations are unchanged; the explicit override also gives
# these runs a key of their own, so they are never confused with (or reused from) runs made
# before the change.
EVAL_CRN = (('eval.batch_prompts', 16),)
FINAL_AVG = 'final:eval/avg@'  # the eval/avg@K key, K = config.eval.sampling.num_samples
# Unbiased pass@K from the same K samples (jtc.rl.evaluation.pass_at_k), the largest K logged.
FINAL_PASS = 'final:eval/pass@'
BETTER, LOWER = '>', '<'
GATED = (('loss.hparams.clip_gating', 'gspo'),)

GSPO = Run('gspo', 'gspo', 'GSPO')
DFPO_MIN = Run('dfpo_min_replace', 'dfpo_min_replace', 'DFPO (Min-Replace)')
DFPO_GATED = Run('dfpo_min_replace_gated', 'dfpo_min_replace', 'DFPO (Min-Replace, gated)', GATED)
GRPO = Run('grpo', 'grpo', 'GRPO')
GRPO_FIX = Run('grpo_fix', 'grpo_fix', 'GRPO-fix')
DFPO_LABELS = (DFPO_MIN.label, DFPO_GATED.label)
# 1e-4 and 2e-4 from the start; 5e-5 added after every method did best at 1e-4 (the lowest), to
# bracket each method's best rate.
LEARNING_RATES = (('5e-5', 5e-5), ('1e-4', 1e-4), ('2e-4', 2e-4))


def at(run, group, *overrides):
  """``run`` in ``group`` with extra overrides (appended after its own)."""
  tag = '_'.join(f'{k.split(".")[-1]}{v}' for k, v in overrides)
  return Run(f'{run.name}_{tag}' if tag else run.name, run.config, run.label,
             tuple(run.overrides) + tuple(overrides), group)


def num_steps_of(smoke, full=FULL_STEPS):
  return SMOKE_STEPS if smoke else full


def shared_overrides(num_steps, *extra, diagnostics_every=5):
  """Evaluate at step 0 and at the end; the per-step diagnostics every 5 steps (measured at
  the off-policy mini-batches, see jtc/update.run_updates) so `mechanism` reads these runs (0:
  none; they never change the training)."""
  return (('eval.every', num_steps), ('log.diagnostics_every', diagnostics_every)) + extra


def predicted(runs, labels, op):
  """((group, label), op) for every run of ``runs`` whose label is one of ``labels``."""
  return tuple(((r.group, r.label), op) for r in runs if r.label in labels)


def lr_runs(runs, smoke):
  out = [
      at(r, f'lr={name}', ('optim.learning_rate', lr)) for name, lr in LEARNING_RATES for r in runs
  ]
  return tuple(r for r in out if not smoke or r.group == 'lr=1e-4')


def make_sweep(name, smoke, **kw):
  kw.setdefault('num_steps', num_steps_of(smoke))
  kw.setdefault('seeds', 1 if smoke else SEEDS)
  kw.setdefault('shared', shared_overrides(kw['num_steps']))
  return Sweep(name=name, smoke=smoke, config_arg='smoke' if smoke else '', **kw)
