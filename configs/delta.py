"""DelTA: the DAPO surrogate re-weighted by per-token discriminative coefficients (arXiv 2605.21467).

Run:
  python -m jtc.train --config configs/delta.py --workdir /tmp/jtc/delta
Smoke test (seconds):
  python -m jtc.train --config configs/delta.py:smoke --workdir /tmp/jtc/delta_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'delta', eps_low=0.2, eps_high=0.28)
  c.token_weights = 'delta'  # the DelTA coefficients, options in c.delta
  return c
