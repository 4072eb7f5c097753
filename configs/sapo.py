"""SAPO: soft adaptive (sigmoid-gated) policy optimisation, a smooth alternative to hard clipping.

Run:
  python -m jtc.train --config configs/sapo.py --workdir /tmp/jtc/sapo
Smoke test (seconds):
  python -m jtc.train --config configs/sapo.py:smoke --workdir /tmp/jtc/sapo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'sapo')
  return c
