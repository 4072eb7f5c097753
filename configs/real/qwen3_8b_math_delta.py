"""Qwen3-8B on a MATH-style dataset with DelTA (arXiv 2605.21467): the DAPO surrogate with
per-token discriminative coefficients, lambda in [0.8, 1.2], one refinement, no dynamic sampling
(as in the paper's main runs); optimisation and decoding as in configs/real/base.py.

Run:
  python -m jtc.train --config configs/real/qwen3_8b_math_delta.py \
    --config.checkpoint=/path/to/Qwen3-8B-Base --config.dataset=/path/to/deepmath/train.jsonl \
    --config.eval_dataset=/path/to/math/test.jsonl --workdir /tmp/jtc/qwen3_8b_math_delta
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/qwen3_8b_math_delta.py:smoke \
    --config.checkpoint=TINY_HF_DIR --config.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'delta', eps_low=0.2, eps_high=0.28)
  c.advantage = 'grpo'
  c.delta.lam_min = 0.8
  c.delta.lam_max = 1.2
  c.delta.num_refine = 1
  c.num_steps = 300
  c.prompts_per_step = 128
  c.microbatch_prompts = 1
  c.rollout_chunk_prompts = 8          # 8 x 32 rows per sampler call
  c.prompt_width = 1024
  c.max_new_tokens = 8192
  c.dynamic_sampling = False
  c.overlong_buffer = 2048
  c.mesh_data = 1
  c.mesh_fsdp = -1
  if args.get('smoke'):
    base.smoke(c)
  return c
