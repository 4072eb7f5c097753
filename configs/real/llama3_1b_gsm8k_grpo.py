"""Llama-3.2-1B-Instruct on GSM8K with GRPO (the paper's Appendix I/J settings).

RoPE: every Llama-3.2 config.json declares "llama3" frequency scaling (factor 32, low/high
frequency factors 1/4, original context 8192), which `jtc.models.hf_import` reads and `jtc.models.model`
applies. It rescales frequencies, not long positions only: at head_dim 64 and theta 5e5, 17 of
the 32 RoPE frequencies (those with wavelength >= 8192 / 4 tokens) differ from plain RoPE, so
it changes the attention at every position (tested against transformers in
tests/models/test_hf_import.py and tests/models/test_model.py).

Run:
  python -m jtc.train --config configs/real/llama3_1b_gsm8k_grpo.py \
    --config.policy.checkpoint=/path/to/Llama-3.2-1B-Instruct --config.data.dataset=/path/to/gsm8k/train.jsonl \
    --config.data.eval_dataset=/path/to/gsm8k/test.jsonl --workdir /tmp/jtc/llama3_1b_gsm8k_grpo
Smoke test (CPU, tiny checkpoint):
  python -m jtc.train --config configs/real/llama3_1b_gsm8k_grpo.py:smoke \
    --config.policy.checkpoint=TINY_HF_DIR --config.data.dataset=TINY.jsonl --workdir /tmp/jtc/real_smoke
"""

from configs import common
from configs.real import base


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = base.get_config(None)
  common.set_loss(c, 'grpo')
  c.advantage.name = 'grpo'
  c.policy.preset = 'llama3_1b'  # the architecture `python -m jtc.plan` plans without weights
  c.num_steps = 200
  c.rollout.prompts_per_step = 64
  c.optim.microbatch_prompts = 4
  c.rollout.chunk_prompts = 32  # 32 x 32 rows per sampler call
  c.data.prompt_width = 256
  c.rollout.sampling.max_new_tokens = 1024
  c.eval.sampling.max_new_tokens = 1024
  c.mesh.data = -1
  c.mesh.fsdp = 1
  if args.get('smoke'):
    base.smoke(c)
  return c
