"""DFPO (Positive Orth-Proj): the non-negative projection of paper Eq. 51 (QP) or Eq. 52-55.

Run:
  python -m jtc.train --config configs/dfpo_pos_orth_proj.py --workdir /tmp/jtc/dfpo_pos_orth_proj
Smoke test (seconds):
  python -m jtc.train --config configs/dfpo_pos_orth_proj.py:smoke --workdir /tmp/jtc/dfpo_pos_orth_proj_smoke
"""

from configs import common


def get_config(arg=None):
  c = common.get_config(arg)
  c.advantage.name = 'grpo'
  common.set_loss(c, 'dfpo_pos_orth_proj', eps_low=3e-4, eps_high=4e-4, solver='qp')
  # Paper Table 3 ablations: --config.loss.hparams.stop_gradient=False, or
  # --config.loss.hparams.global_scale=0.5 (replace the transform by 0.5 * s_bar).
  return c
