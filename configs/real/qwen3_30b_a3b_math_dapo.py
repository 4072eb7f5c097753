"""Qwen3-30B-A3B (a mixture of experts: 128 experts, 8 routed per token, ~3B active parameters)
on a MATH-style dataset with DAPO (clip-higher, token-mean) at a 32k context, routing replay on:
the behaviour pass and every update route each completion token to the experts the sampler chose
(R3; `rollout.routing_replay`, docs/mismatch.md), with the load-balancing loss at Hugging Face's
weight (`loss.router_aux_coef`). Optimisation and decoding as the other real configs (paper
Appendix I/J); dynamic sampling off, the soft overlong punishment over the last 4k tokens.

Memory: 30.5B parameters in float32 with AdamW state (~366 GB) split over fsdp x tensor; at 32k
tokens the trunk attends blockwise (`policy.attention='auto'` picks it off CPU). It fits a
v5p-128 and a v5p-256 as configured (docs/scaling.md's generated table). Plan it first:
  python -m jtc.plan --config configs/real/qwen3_30b_a3b_math_dapo.py --topology v5p-128
Run:
  python -m jtc.train --config configs/real/qwen3_30b_a3b_math_dapo.py \
    --config.policy.checkpoint=/path/to/Qwen3-30B-A3B-Base --config.data.dataset=/path/to/math/train.jsonl \
    --config.data.eval_dataset=/path/to/math/test.jsonl --workdir /tmp/jtc/qwen3_30b_a3b_math_dapo
Smoke test (CPU, a tiny MoE checkpoint):
  python -m jtc.train --config configs/real/qwen3_30b_a3b_math_dapo.py:smoke \
    --config.policy.checkpoint=TINY_MOE_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'dapo', eps_low=0.2, eps_high=0.28, aggregation='token_mean')
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_30b_a3b'  # the architecture `python -m jtc.plan` plans without weights
  c.num_steps = 200
  c.rollout.prompts_per_step = 32  # one mini-batch of 32 prompts x 32 rollouts per step
  c.optim.microbatch_prompts = 1  # 32 sequences of <= 32k tokens per backward pass
  c.rollout.chunk_prompts = 32  # every prompt in one sampler call: its KV cache splits over fsdp
  c.rollout.score_chunk_prompts = 4  # the behaviour pass 128 rows of 32k tokens at a time
  c.data.prompt_width = 1024
  c.rollout.sampling.max_new_tokens = 31_744  # 32k context: prompt + completion = 32,768
  c.eval.sampling.max_new_tokens = 31_744
  c.dapo.dynamic_sampling = False
  c.dapo.overlong_buffer = 4096  # DAPO soft overlong punishment over the last 4k tokens
  c.dapo.overlong_penalty = 1.0
  c.rollout.routing_replay = 'behaviour'  # R3: the sampler's experts in every training pass
  c.loss.router_aux_coef = 0.001  # Qwen3-MoE's router_aux_loss_coef
  # Parameters and AdamW state over fsdp x tensor (the experts' weights split over their model
  # and hidden dimensions like a dense MLP's), every batch's rows over fsdp, kv heads over
  # tensor; each fsdp shard sorts its own rows' expert pairs (`moe.rows_local`). `mesh.expert`
  # stays 1: with `policy.moe_dispatch='all_to_all'` it exchanges tokens, but at these shapes
  # its worst-case slots cost more memory than splitting the experts saves (docs/models.md).
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  if args.get('smoke'):
    base.smoke(c)
  return c
