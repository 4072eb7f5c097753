"""The papers' experiments as plain data: `SWEEPS[name](smoke=False) -> Sweep`, and the claims
they carry (`CLAIMS`, experiments/sweeps/claims.py).

  base.py     Run, Table, Sweep, Claim and the helpers that build sweeps
  paper.py    the exploratory sweeps (seeds 0-7): the papers' tables at CPU scale
  confirm.py  the confirmatory sweeps (fresh seeds from 8, settings fixed before they ran)
  stepsize.py the step-size account's test (factors chosen on seeds 0-7, confirmed on 24-39)
  lag.py      the policy-lag axis (asynchronous RL's off-policy data), exploratory
  lora.py     GSPO vs literal DFPO under LoRA ranks 1, 4, 16 (rates chosen on seeds 0-3)
  bestlr.py   best-vs-best: each method's learning rate chosen on seeds 0-7 by a declared rule
  moe.py      GRPO, GSPO, DFPO on the tiny MoE policy, routing replay none vs behaviour
  credit.py   the Cancellation Hypothesis's batching prediction (GRPO, whole groups vs rows)
  claims.py   every claim: comparison, family, the paper's delta and sign, SESOI, kind
"""
import dataclasses

from experiments.sweeps import bestlr
from experiments.sweeps import confirm
from experiments.sweeps import credit
from experiments.sweeps import lag
from experiments.sweeps import lora
from experiments.sweeps import mismatch
from experiments.sweeps import moe
from experiments.sweeps import paper
from experiments.sweeps import stepsize
from experiments.sweeps.base import (FINAL_AVG, FULL_STEPS, LEARNING_RATES, SEEDS, Run, Sweep,
                                     Table, estimate_seconds)

SWEEPS = {
    'table1': paper.table1,
    'mechanism': paper.mechanism,
    'table2': paper.table2,
    'table3': paper.table3,
    'offpolicy': paper.offpolicy,
    'table4': paper.table4,
    'drift': paper.drift,
    'delta': paper.delta,
    **confirm.SWEEPS,
    'mismatch': mismatch.mismatch,
    **stepsize.SWEEPS,
    **lag.SWEEPS,
    **lora.SWEEPS,
    **bestlr.SWEEPS,
    **credit.SWEEPS,
    **moe.SWEEPS,
}


def get_sweep(name, *, smoke=False, num_steps=None):
  """The sweep `name` (smoke form if `smoke`); `num_steps` replaces the sweep's knob."""
  if name not in SWEEPS:
    raise ValueError(f'unknown sweep {name!r}; valid: {sorted(SWEEPS)}')
  sweep = SWEEPS[name](smoke=smoke)
  if num_steps is not None:
    if num_steps < 1:
      raise ValueError(f'num_steps={num_steps!r} must be >= 1')
    shared = tuple((k, num_steps if k == 'eval.every' and v == sweep.num_steps else v)
                   for k, v in sweep.shared)  # an end-only evaluation stays end-only
    sweep = dataclasses.replace(sweep, num_steps=num_steps, shared=shared)
  return sweep
