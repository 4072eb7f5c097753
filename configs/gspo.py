"""GSPO: length-normalised sequence ratio (paper Eq. 44) with a sequence-level clip (Zheng et al., 2025).

Run:
  python -m jtc.train --config configs/gspo.py --workdir /tmp/jtc/gspo
Smoke test (seconds):
  python -m jtc.train --config configs/gspo.py:smoke --workdir /tmp/jtc/gspo_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'gspo', eps_low=3e-4, eps_high=4e-4)
  return c
