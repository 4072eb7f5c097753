"""Shared settings of the real-model configs in `configs/real/` (paper Appendix I / J).

Optimisation (2604.13088 Appendix I): AdamW, peak learning rate 8e-7, linear warm-up over 3% of
the updates, cosine decay to 0.2 x peak, no entropy bonus, 32 rollouts per prompt, mini-batches
of 32 prompts. Evaluation decoding (Appendix J, Qwen3): temperature 0.6, top-p 0.95, top-k 20,
min-p 0. Rewards: the last `\\boxed{}` of a completion must equal the reference answer.
Memory: float32 master weights and AdamW state, bfloat16 compute, per-block rematerialisation,
gradient accumulation over micro-batches.

Every real config needs `--config.checkpoint=DIR` (a Hugging Face directory with config.json,
*.safetensors, tokenizer.json and tokenizer_config.json) and `--config.dataset=FILE.jsonl`
(question/answer records; GSM8K "#### 42" and MATH "\\boxed{x}" answers are understood).

`smoke` shrinks a config to a seconds-long CPU run against a tiny checkpoint (tests).
"""

from configs import common

MATH_SUFFIX = '\nPlease reason step by step, and put your final answer within \\boxed{}.'


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.get_config(None)
  c.init_policy = ''                   # a real run starts from --config.checkpoint
  c.task = ''                          # ... and reads --config.dataset
  c.reward = 'boxed_numeric'
  c.prompt_suffix = MATH_SUFFIX
  c.chat_template = True

  c.learning_rate = 8e-7
  c.warmup_frac = 0.03
  c.min_lr_ratio = 0.2
  c.weight_decay = 0.0
  c.grad_clip = 1.0
  c.group_size = 32                    # rollouts per prompt
  c.minibatch_prompts = 32             # mini-batch (prompts per optimiser step)
  c.ppo_epochs = 1
  c.temperature = 1.0                  # rollouts sample the full distribution

  c.eval_temperature = 0.6
  c.eval_top_p = 0.95
  c.eval_top_k = 20
  c.eval_min_p = 0.0
  c.eval_k = 4
  c.eval_every = 20
  c.eval_problems = 256

  c.param_dtype = 'float32'
  c.compute_dtype = 'bfloat16'
  c.remat = True
  c.diagnostics_every = 0              # the proxy diagnostics cost ~1/3 of an update
  c.ckpt_every = 20
  c.keep_checkpoints = 2
  if args.get('smoke'):
    smoke(c)
  return c


def smoke(c):
  """A seconds-long CPU run of the same code paths (tiny checkpoint, tiny JSONL)."""
  c.num_steps = 2
  c.prompts_per_step = 2
  c.group_size = 4
  c.minibatch_prompts = 2
  c.microbatch_prompts = 1             # exercises gradient accumulation
  c.rollout_chunk_prompts = 1          # ... and chunked sampling / scoring
  c.prompt_width = 160
  c.max_new_tokens = 12
  c.overlong_buffer = min(c.overlong_buffer, 4)
  c.dynamic_sampling_rounds = 1
  c.eval_every = 2
  c.eval_problems = 2
  c.eval_k = 2
  c.ckpt_every = 1
  c.diagnostics_every = 1
  c.learning_rate = 1e-3               # so that two steps visibly move the tiny model
  c.mesh_data = -1
  c.mesh_fsdp = 1
