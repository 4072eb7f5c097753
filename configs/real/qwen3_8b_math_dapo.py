"""Qwen3-8B on a MATH-style dataset with DAPO (clip-higher, token-mean), the paper's Appendix
I/J optimisation and decoding settings. It differs from qwen3_8b_math_delta.py only in the method:
dynamic sampling is off for both, as in the DelTA paper's main runs (DAPO's full recipe turns it
on: --config.dapo.dynamic_sampling=True); both use the soft overlong punishment over 2k tokens.

Run (8 GPUs or a TPU pod slice; see docs/scaling.md for multi-host launch):
  python -m jtc.train --config configs/real/qwen3_8b_math_dapo.py \
    --config.policy.checkpoint=/path/to/Qwen3-8B-Base --config.data.dataset=/path/to/math/train.jsonl \
    --config.data.eval_dataset=/path/to/math/test.jsonl --workdir /tmp/jtc/qwen3_8b_math_dapo
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/qwen3_8b_math_dapo.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'dapo', eps_low=0.2, eps_high=0.28, aggregation='token_mean')
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_8b'  # the architecture `python -m jtc.plan` plans without weights
  c.num_steps = 300
  c.rollout.prompts_per_step = 128  # 128 x 32 = 4096 rollouts; 4 optimiser steps per RL step
  c.optim.microbatch_prompts = 1  # 32 sequences of <= 9216 tokens per backward pass
  c.rollout.chunk_prompts = 8  # 8 x 32 rows: ~43 GB of bf16 KV cache per 8-way shard
  c.data.prompt_width = 1024
  c.rollout.sampling.max_new_tokens = 8192
  c.eval.sampling.max_new_tokens = 8192
  c.dapo.dynamic_sampling = False
  c.dapo.overlong_buffer = 2048  # DAPO soft overlong punishment over the last 2k tokens
  c.dapo.overlong_penalty = 1.0
  c.mesh.data = 1
  c.mesh.fsdp = -1  # 8B: FSDP over every device (params + AdamW sharded)
  if args.get('smoke'):
    base.smoke(c)
  return c
