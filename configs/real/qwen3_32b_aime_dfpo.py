"""Qwen3-32B on AIME-style problems with DFPO (Min-Replace): the Token Gradient Cancellation
paper's own setting (arXiv 2604.13088, Appendix I/J): 32k context, 32 rollouts per prompt,
mini-batches of 32 prompts, peak learning rate 8e-7 (cosine to 0.2 x peak, 3 % warm-up), no
entropy bonus; evaluation at temperature 0.6, top-p 0.95, top-k 20. The paper does not state the
prompts per RL step: 32 here (one mini-batch, one optimiser step per RL step).

Memory: at 32k tokens the [L, L] attention scores of one sequence would take ~137 GB per layer,
so the trunk attends blockwise (`policy.attention='auto'` picks it off CPU); plan it first:
  python -m jtc.plan --config configs/real/qwen3_32b_aime_dfpo.py --topology v5p-256
Run:
  python -m jtc.train --config configs/real/qwen3_32b_aime_dfpo.py \
    --config.policy.checkpoint=/path/to/Qwen3-32B --config.data.dataset=/path/to/math/train.jsonl \
    --config.data.eval_dataset=/path/to/aime25.jsonl --workdir /tmp/jtc/qwen3_32b_aime_dfpo
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/qwen3_32b_aime_dfpo.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'dfpo_min_replace', eps_low=3e-4, eps_high=4e-4)
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_32b'  # the architecture `python -m jtc.plan` plans without weights
  c.num_steps = 200
  c.rollout.prompts_per_step = 32  # one mini-batch of 32 prompts x 32 rollouts per step
  c.optim.minibatch_prompts = 32  # Appendix I: mini-batch size 32
  c.optim.microbatch_prompts = 1  # 32 sequences of <= 32k tokens per backward pass
  c.rollout.chunk_prompts = 32  # every prompt in one sampler call: its KV cache splits over fsdp
  # The behaviour pass 4 prompts (128 rows of 32k tokens) at a time: all 1024 rows at once would
  # hold ~8x the activations (planned: 16.6 GiB per chip on v5p-256 at 4 prompts).
  c.rollout.score_chunk_prompts = 4
  c.data.prompt_width = 1024
  c.rollout.sampling.max_new_tokens = 31_744  # 32k context: prompt + completion = 32,768
  c.eval.sampling.max_new_tokens = 31_744
  c.eval.problems = 30  # AIME 2025 has 30 problems
  c.eval.sampling.num_samples = 32  # avg@32, as the paper reports
  c.eval.every = 20
  # Planned for a v5p-256 (128 chips; python -m jtc.plan --topology v5p-256): parameters and
  # AdamW state over fsdp x tensor, every batch's rows (and the sampler's 7.75 TiB of 32k-token KV
  # cache for 1024 rows) over fsdp, kv heads over tensor.
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  if args.get('smoke'):
    base.smoke(c)
  return c
