"""GRPO: token-factorised PPO clip on group-normalised advantages (Shao et al., 2024).

Run:
  python -m jtc.train --config configs/grpo.py --workdir /tmp/jtc/grpo
Smoke test (seconds):
  python -m jtc.train --config configs/grpo.py:smoke --workdir /tmp/jtc/grpo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'grpo', eps_low=0.2, eps_high=0.2, aggregation='seq_mean_token_mean')
  return c
