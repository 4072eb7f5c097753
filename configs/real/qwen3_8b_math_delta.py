"""Qwen3-8B on a MATH-style dataset with DelTA (arXiv 2605.21467): the DAPO surrogate with
per-token discriminative coefficients, lambda in [0.8, 1.2], one refinement, no dynamic sampling
(as in the paper's main runs); optimisation and decoding as in configs/real/base.py.

Run:
  python -m jtc.train --config configs/real/qwen3_8b_math_delta.py \
    --config.policy.checkpoint=/path/to/Qwen3-8B-Base --config.data.dataset=/path/to/deepmath/train.jsonl \
    --config.data.eval_dataset=/path/to/math/test.jsonl --workdir /tmp/jtc/qwen3_8b_math_delta
On a v6e-16 DelTA fits only with its hidden states recomputed a scoring chunk at a time instead
of held from the behaviour pass (`jtc plan --suggest`'s setting, 29.3 GiB per chip;
docs/scaling.md):
  --config.delta.hidden=recomputed --config.mesh.data=1 --config.mesh.fsdp=16 \
    --config.mesh.tensor=1 --config.optim.microbatch_prompts=1 --config.rollout.chunk_prompts=8 \
    --config.rollout.score_chunk_prompts=1 --config.policy.remat=True
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/qwen3_8b_math_delta.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'delta', eps_low=0.2, eps_high=0.28)
  c.token_weights = 'delta'  # the DelTA coefficients, options in c.delta
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_8b'  # the architecture `python -m jtc.plan` plans without weights
  c.delta.lam_min = 0.8
  c.delta.lam_max = 1.2
  c.delta.num_refine = 1
  c.num_steps = 300
  c.rollout.prompts_per_step = 128
  c.optim.microbatch_prompts = 1
  c.rollout.chunk_prompts = 8  # 8 x 32 rows per sampler call
  c.data.prompt_width = 1024
  c.rollout.sampling.max_new_tokens = 8192
  c.eval.sampling.max_new_tokens = 8192
  c.dapo.dynamic_sampling = False
  c.dapo.overlong_buffer = 2048
  c.mesh.data = 1
  c.mesh.fsdp = -1
  if args.get('smoke'):
    base.smoke(c)
  return c
