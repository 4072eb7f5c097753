"""Qwen3-14B on a MATH-style dataset with DelTA (arXiv 2605.21467), the paper's second model at
its 30,000-token generation budget: the DAPO surrogate with per-token discriminative
coefficients, lambda in [0.8, 1.2], one refinement, no dynamic sampling; optimisation and
decoding as in configs/real/base.py, batches as configs/real/qwen3_8b_math_delta.py.

Run:
  python -m jtc.train --config configs/real/qwen3_14b_math_delta.py \
    --config.policy.checkpoint=/path/to/Qwen3-14B-Base --config.data.dataset=/path/to/deepmath/train.jsonl \
    --config.data.eval_dataset=/path/to/math/test.jsonl --workdir /tmp/jtc/qwen3_14b_math_delta
Plan it first (every stage compiled for the slice, docs/scaling.md):
  python -m jtc.plan --config configs/real/qwen3_14b_math_delta.py --topology v5p-128 --suggest
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/qwen3_14b_math_delta.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base
from configs.real import qwen3_8b_math_delta


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = qwen3_8b_math_delta.get_config(None)
  c.policy.preset = 'qwen3_14b'  # the architecture `python -m jtc.plan` plans without weights
  c.rollout.sampling.max_new_tokens = 30_000  # the paper's generation budget (30,000 tokens)
  c.eval.sampling.max_new_tokens = 30_000
  c.dapo.overlong_buffer = 4096
  # 2 x 32 rows per sampler call: a row's KV cache is ~5 GB at 31k tokens (40 layers, 8 kv heads).
  c.rollout.chunk_prompts = 2
  if args.get('smoke'):
    base.smoke(c)
  return c
