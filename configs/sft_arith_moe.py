"""Supervised training of the mixture-of-experts base policy (`ModelConfig.tiny_moe`: 8 experts
of width 192, 2 per token, the dense policy's active MLP width) on arithmetic solutions: the
dense policy's recipe (configs/sft_arith.py) plus Hugging Face's load-balancing loss at its
default weight 0.001.

The policy that ships in jtc/assets/moe_policy (`--config.policy.init=moe`) was made by this
config at revision f359c9e (1,300 steps, 17.5 min on the shared 2-core machine; held-out avg@4
51.0%, formats: steps 48%, equation 46%, answer 6%):
  python -m jtc.sft --config configs/sft_arith_moe.py --workdir /tmp/jtc/sft_moe \
      --config.export_to=jtc/assets/moe_policy
Smoke test:
  python -m jtc.sft --config configs/sft_arith_moe.py:smoke --workdir /tmp/jtc/sft_moe_smoke
"""

from configs import sft_arith


def get_config(arg=None):
  c = sft_arith.get_config(arg)
  c.model_preset = 'tiny_moe'  # a jtc.models.model.ModelConfig classmethod
  c.router_aux_coef = 0.001  # HF's router_aux_loss_coef default
  return c
