"""GRPO-fix: symmetric clipping A*clip(r, 0, 1+eps) so shared tokens cancel (paper Eq. 79-80).

Run:
  python -m jtc.train --config configs/grpo_fix.py --workdir /tmp/jtc/grpo_fix
Smoke test (seconds):
  python -m jtc.train --config configs/grpo_fix.py:smoke --workdir /tmp/jtc/grpo_fix_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'grpo_fix', eps_high=0.2, aggregation='seq_mean_token_mean')
  return c
