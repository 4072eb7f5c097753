"""Qwen3-Next-80B-A3B (a Gated DeltaNet / gated attention hybrid with a 512-expert mixture: 10
routed and a shared expert per token, ~3B active parameters) with DFPO (Min-Replace): the second
model of the Token Gradient Cancellation paper's Table 1 (arXiv 2604.13088; the Thinking model),
at a 32k context as configs/real/qwen3_32b_aime_dfpo.py (Appendix I: 32 rollouts per prompt,
mini-batches of 32 prompts, peak learning rate 8e-7, cosine to 0.2 x peak, 3 % warm-up, no
entropy bonus). Routing replay on (R3, as configs/real/qwen3_30b_a3b_math_dapo.py): the behaviour
pass and every update route each completion token to the experts the sampler chose, with the
load-balancing loss at Hugging Face's weight. Evaluation decodes with Appendix J's Qwen3-Next
settings: temperature 0.7, top-p 0.8, top-k 20. The paper trains this model at a 256k context
(Appendix I); 32k is the setting planned here (`--config.rollout.sampling.max_new_tokens` and
`--config.eval.sampling.max_new_tokens` set another).

Memory: 80B parameters in float32 with AdamW state (~960 GB) split over fsdp x tensor; only the
12 full-attention layers keep a KV cache in the sampler, the 36 Gated DeltaNet layers a
constant-size state per row; at 32k tokens the full-attention layers attend blockwise
(`policy.attention='auto'` picks it off CPU). Plan it first:
  python -m jtc.plan --config configs/real/qwen3_next_80b_a3b_aime_dfpo.py --topology v5p-256
Run:
  python -m jtc.train --config configs/real/qwen3_next_80b_a3b_aime_dfpo.py \
    --config.policy.checkpoint=/path/to/Qwen3-Next-80B-A3B-Thinking --config.data.dataset=/path/to/math/train.jsonl \
    --config.data.eval_dataset=/path/to/aime25.jsonl --workdir /tmp/jtc/qwen3_next_80b_a3b_aime_dfpo
Smoke test (CPU, tiny hybrid MoE checkpoint: jtc tiny-checkpoint TINY_HF_DIR --like qwen3_next):
  python -m jtc.train --config configs/real/qwen3_next_80b_a3b_aime_dfpo.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'dfpo_min_replace', eps_low=3e-4, eps_high=4e-4)
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_next_80b_a3b'  # what `python -m jtc.plan` plans without weights
  c.num_steps = 200
  c.rollout.prompts_per_step = 32  # one mini-batch of 32 prompts x 32 rollouts per step
  c.optim.minibatch_prompts = 32  # Appendix I: mini-batch size 32
  c.optim.microbatch_prompts = 1  # 32 sequences of <= 32k tokens per backward pass
  c.rollout.chunk_prompts = 32  # every prompt in one sampler call: its KV cache splits over fsdp
  c.rollout.score_chunk_prompts = 4  # the behaviour pass 128 rows of 32k tokens at a time
  c.data.prompt_width = 1024
  c.rollout.sampling.max_new_tokens = 31_744  # 32k context: prompt + completion = 32,768
  c.eval.sampling.max_new_tokens = 31_744
  c.eval.sampling.temperature = 0.7  # Appendix J, Qwen3-Next
  c.eval.sampling.top_p = 0.8
  c.eval.problems = 30  # AIME 2025 has 30 problems
  c.eval.sampling.num_samples = 32  # avg@32, as the paper reports
  c.eval.every = 20
  c.rollout.routing_replay = 'behaviour'  # R3: the sampler's experts in every training pass
  c.loss.router_aux_coef = 0.001  # Qwen3-Next's router_aux_loss_coef
  # Parameters and AdamW state over fsdp x tensor (the experts' weights split over their model
  # and hidden dimensions like a dense MLP's; the Gated DeltaNet's 16 key / 32 value heads and
  # the 16 attention heads over tensor, the 2 kv heads replicated along it), every batch's rows
  # over fsdp. `mesh.expert` stays 1 (as the 30B-A3B config).
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  if args.get('smoke'):
    base.smoke(c)
  return c
