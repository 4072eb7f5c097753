"""DAPO: clip-higher (eps_high = 0.28) with token-mean aggregation (Yu et al., 2025).

A method config changes the method and nothing else, so this one differs from the others only in
`loss` (as in the DelTA paper, which turns dynamic sampling off for every method). DAPO's two
data-side options are switches of every config (configs/common.py); the full DAPO recipe is
  --config.dapo.dynamic_sampling=True --config.dapo.overlong_buffer=8

Run:
  python -m jtc.train --config configs/dapo.py --workdir /tmp/jtc/dapo
Smoke test (seconds):
  python -m jtc.train --config configs/dapo.py:smoke --workdir /tmp/jtc/dapo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'dapo', eps_low=0.2, eps_high=0.28, aggregation='token_mean')
  return c
