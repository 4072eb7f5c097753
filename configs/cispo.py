"""CISPO: clipped importance-sampling weights with stop-gradient, every token keeps its gradient (MiniMax-M1).

Run:
  python -m jtc.train --config configs/cispo.py --workdir /tmp/jtc/cispo
Smoke test (seconds):
  python -m jtc.train --config configs/cispo.py:smoke --workdir /tmp/jtc/cispo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'cispo')
  return c
