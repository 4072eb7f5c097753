"""Shared settings of the real-model configs in `configs/real/` (paper Appendix I / J).

Optimisation (2604.13088 Appendix I): AdamW, peak learning rate 8e-7, linear warm-up over 3% of
the updates, cosine decay to 0.2 x peak, no entropy bonus, 32 rollouts per prompt, mini-batches
of 32 prompts. Evaluation decoding (Appendix J, Qwen3): temperature 0.6, top-p 0.95, top-k 20,
min-p 0. Rewards: the last `\\boxed{}` of a completion must equal the reference answer.
Memory: float32 master weights and AdamW state, bfloat16 compute, per-block rematerialisation,
gradient accumulation over micro-batches.

Every real config needs `--config.policy.checkpoint=DIR` (a Hugging Face directory with
config.json, *.safetensors, tokenizer.json and tokenizer_config.json) and
`--config.data.dataset=PATH` (question/answer JSONL, GSM8K "#### 42" and MATH "\\boxed{x}"
answers understood; verl-style parquet; a Hugging Face dataset saved with save_to_disk:
docs/data.md, `jtc data PATH` shows how it is read).

`smoke` shrinks a config to a seconds-long CPU run against a tiny checkpoint (tests).
"""

from configs import common

MATH_SUFFIX = '\nPlease reason step by step, and put your final answer within \\boxed{}.'


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.get_config(None)
  c.policy.init = ''  # a real run starts from --config.policy.checkpoint
  c.policy.param_dtype = 'float32'
  c.policy.compute_dtype = 'bfloat16'
  c.policy.remat = True
  c.data.task = ''  # ... and reads --config.data.dataset
  c.data.reward = 'boxed_numeric'
  c.data.prompt_suffix = MATH_SUFFIX
  c.data.chat_template = True

  c.optim.learning_rate = 8e-7
  c.optim.warmup_frac = 0.03
  c.optim.min_lr_ratio = 0.2
  c.optim.weight_decay = 0.0
  c.optim.grad_clip = 1.0
  c.optim.minibatch_prompts = 32  # mini-batch (prompts per optimiser step)
  c.optim.ppo_epochs = 1
  c.rollout.sampling.num_samples = 32  # rollouts per prompt, sampling the full distribution
  c.rollout.sampling.temperature = 1.0

  c.eval.sampling.temperature = 0.6  # Appendix J (Qwen3)
  c.eval.sampling.top_p = 0.95
  c.eval.sampling.top_k = 20
  c.eval.sampling.min_p = 0.0
  c.eval.sampling.num_samples = 4
  c.eval.every = 20
  c.eval.problems = 256

  c.log.diagnostics_every = 0  # the proxy diagnostics cost ~1/3 of an update
  c.log.ckpt_every = 20
  c.log.keep_checkpoints = 2
  if args.get('smoke'):
    smoke(c)
  return c


def smoke(c):
  """A seconds-long CPU run of the same code paths (tiny checkpoint, tiny JSONL)."""
  c.num_steps = 2
  c.rollout.prompts_per_step = 2
  c.rollout.sampling.num_samples = 4
  c.optim.minibatch_prompts = 2
  c.optim.microbatch_prompts = 1  # exercises gradient accumulation
  c.rollout.chunk_prompts = 1  # ... and chunked sampling / scoring
  c.rollout.score_chunk_prompts = 0  # scoring chunked as sampling
  # A GSM8K prompt with a real tokenizer's chat template and the suffix takes up to 259 tokens
  # (the tiny checkpoint's byte-level tokenizer counts bytes: docs/models.md).
  c.data.prompt_width = 288
  c.rollout.sampling.max_new_tokens = 12
  c.eval.sampling.max_new_tokens = 12
  c.dapo.overlong_buffer = min(c.dapo.overlong_buffer, 4)
  c.dapo.dynamic_sampling_rounds = 1
  c.eval.every = 2
  c.eval.problems = 2
  c.eval.batch_prompts = 1
  c.eval.sampling.num_samples = 2
  c.log.ckpt_every = 1
  c.log.diagnostics_every = 1
  c.log.samples_every = 1
  c.optim.learning_rate = 1e-3  # so that two steps visibly move the tiny model
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1  # whatever the real config's tensor parallelism (qwen3_32b: 4)
