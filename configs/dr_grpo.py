"""Dr. GRPO: mean-only advantages, sequence sums normalised by a constant length (Liu et al., 2025).

Run:
  python -m jtc.train --config configs/dr_grpo.py --workdir /tmp/jtc/dr_grpo
Smoke test (seconds):
  python -m jtc.train --config configs/dr_grpo.py:smoke --workdir /tmp/jtc/dr_grpo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'dr_grpo'
  common.set_loss(c, 'dr_grpo', eps_low=0.2, eps_high=0.2, aggregation='seq_mean_token_sum_norm')
  return c
