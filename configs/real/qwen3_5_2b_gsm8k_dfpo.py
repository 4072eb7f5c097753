"""Qwen3.5-2B (a Gated DeltaNet / gated attention hybrid, dense MLP) on GSM8K with DFPO
(Min-Replace), the paper's Appendix I/J settings as configs/real/qwen3_0_6b_gsm8k_dfpo.py.

The published checkpoint is a `Qwen3_5ForConditionalGeneration`; jtc loads its text model
(docs/models.md, "Hybrid models"). The memory settings are the 0.6B config's, whose parameters
are a third of these; planned in docs/scaling.md's generated table (every stage compiled by
libtpu): it fits a v5e-8 with the suggested setting (fsdp 4 x tensor 2, 15.2 GiB per chip; as
configured its update needs 17.0 of 16 GiB), a v5p-64 and a v6e-16 as configured.

Run (one GPU/TPU host; GSM8K as JSONL with "question"/"answer" fields):
  python -m jtc.train --config configs/real/qwen3_5_2b_gsm8k_dfpo.py \
    --config.policy.checkpoint=/path/to/Qwen3.5-2B --config.data.dataset=/path/to/gsm8k/train.jsonl \
    --config.data.eval_dataset=/path/to/gsm8k/test.jsonl --workdir /tmp/jtc/qwen3_5_2b_gsm8k_dfpo
Smoke test (CPU, tiny hybrid checkpoint: jtc tiny-checkpoint TINY_HF_DIR --like qwen3_5):
  python -m jtc.train --config configs/real/qwen3_5_2b_gsm8k_dfpo.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'dfpo_min_replace', eps_low=3e-4, eps_high=4e-4)
  c.advantage.name = 'grpo'
  c.policy.preset = 'qwen3_5_2b'  # the architecture `python -m jtc.plan` plans without weights
  c.num_steps = 200
  c.rollout.prompts_per_step = 64  # 64 prompts x 32 rollouts = 2048 sequences per step
  c.optim.microbatch_prompts = 1  # 32 sequences of <= 1280 tokens per backward pass
  c.rollout.chunk_prompts = 4  # 4 x 32 rows per sampler call
  c.data.prompt_width = 256  # GSM8K question + chat template + suffix
  c.rollout.sampling.max_new_tokens = 1024
  c.eval.sampling.max_new_tokens = 1024
  # Parameters and AdamW state sharded over every device (on one device: as data parallelism).
  c.mesh.data = 1
  c.mesh.fsdp = -1
  if args.get('smoke'):
    base.smoke(c)
  return c
