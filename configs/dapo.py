"""DAPO: clip-higher, token-mean aggregation, dynamic sampling, overlong shaping (Yu et al., 2025).

Run:
  python -m jtc.train --config configs/dapo.py --workdir /tmp/jtc/dapo
Smoke test (seconds):
  python -m jtc.train --config configs/dapo.py:smoke --workdir /tmp/jtc/dapo_smoke
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.get_config(arg)
  c.advantage = 'grpo'
  common.set_loss(c, 'dapo', eps_low=0.2, eps_high=0.28, aggregation='token_mean')
  c.dynamic_sampling = not args.get('smoke')
  c.overlong_buffer = 8
  return c
