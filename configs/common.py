"""Shared defaults for every RL config in `configs/`.

A method config is `common.get_config(arg)` with `config.loss` (and, for DelTA, `config.delta`)
filled in. Defaults follow the paper's Appendix I where it applies (AdamW, linear warm-up over
3% of the steps, cosine decay to 0.2 of the peak learning rate, no entropy bonus) scaled to the
tiny default policy that ships with jtc (`jtc/assets/base_policy`).

Args accepted by every method config (comma separated, e.g. `configs/gspo.py:smoke`):
  smoke     a few-second run for tests: 2 steps, 2 prompts x 4 samples, short completions.
  runlocal  a one-minute run for eyeballing a change.
"""

import ml_collections


def parse_arg(arg):
  """`'smoke,seed=3'` -> {'smoke': True, 'seed': '3'}."""
  out = {}
  for part in (arg or '').split(','):
    part = part.strip()
    if not part:
      continue
    key, _, value = part.partition('=')
    out[key] = value if value else True
  unknown = set(out) - {'smoke', 'runlocal'}
  if unknown:
    raise ValueError(f'unknown config arg(s) {sorted(unknown)}; valid: smoke, runlocal')
  return out


def set_loss(c, name, **overrides):
  """Sets `c.loss` to `name` with every hyper-parameter of that loss exposed for overriding.

  The hyper-parameters come from `jtc.objectives.default_hparams(name)`, so
  `--config.loss.hparams.<key>=...` works for exactly the keys that loss accepts.
  """
  from jtc import objectives  # pylint: disable=import-outside-toplevel
  hparams = dict(objectives.default_hparams(name))
  unknown = set(overrides) - set(hparams)
  if unknown:
    raise ValueError(f'loss {name!r} has no hyper-parameter(s) {sorted(unknown)}; '
                     f'valid: {sorted(hparams)}')
  hparams.update(overrides)
  # A hyper-parameter that defaults to None (off) becomes a float placeholder, so that
  # `--config.loss.hparams.global_scale=0.5` can still set it from the command line.
  hparams = {k: ml_collections.config_dict.placeholder(float) if v is None else v
             for k, v in hparams.items()}
  c.loss.name = name
  c.loss.hparams = ml_collections.ConfigDict(hparams)


def get_config(arg=None):
  """The defaults; method configs override `loss` (and `delta`)."""
  args = parse_arg(arg)
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Policy: a bundle directory written by `python -m jtc.sft` ('base' = the one shipped in jtc).
  c.init_policy = 'base'
  c.model_overrides = ml_collections.ConfigDict()  # e.g. --config.model_overrides.dtype=bfloat16
  c.checkpoint = ''                    # a Hugging Face model dir (Qwen3/Qwen2/Llama); overrides
                                       # init_policy; tokenizer + chat template + eos/pad from it

  # Task and data.
  c.task = 'arithmetic'                # a name from jtc.tasks
  c.data_dir = ''                      # '' = $JTC_DATA_DIR or ~/.cache/jtc/data
  c.prompt_width = 20                  # P: prompts (with BOS) are left-padded to this width
  c.dataset = ''                       # question/answer JSONL file or dir of <split>.jsonl;
                                       # replaces task (GSM8K '#### x' / MATH '\boxed{x}' answers)
  c.eval_dataset = ''                  # held-out JSONL for a dataset run ('' = dataset's test split)
  c.reward = ''                        # '' = the task's verifier, or boxed_numeric for a dataset;
                                       # else a name in jtc.rewards.REWARD_FNS
  c.prompt_suffix = ''                 # appended to every question before the chat template
  c.chat_template = True               # wrap prompts with the tokenizer's chat template

  # Rollouts.
  c.num_steps = 200                    # RL steps (one rollout batch each)
  c.prompts_per_step = 16              # groups per step
  c.group_size = 8                     # G: completions per prompt
  c.max_new_tokens = 32                # T
  c.temperature = 1.0                  # sampling temperature of the rollouts
  c.top_k = 0                          # 0 = off
  c.top_p = 1.0
  c.min_p = 0.0

  # Advantages (jtc.advantages).
  c.advantage = 'grpo'                 # grpo | dr_grpo | rloo
  c.adv_eps = 1e-6
  c.adv_std_ddof = 0
  c.adv_batch_normalize = False

  # Loss (jtc.objectives.compute_loss): name + its hyper-parameters.
  c.loss = ml_collections.ConfigDict()
  c.loss.name = 'grpo'
  c.loss.hparams = ml_collections.ConfigDict()

  # DelTA token coefficients (jtc.delta); used when loss.name == 'delta'.
  c.delta = ml_collections.ConfigDict()
  c.delta.ablation = 'full'
  c.delta.lam_min = 0.8
  c.delta.lam_max = 1.2
  c.delta.num_refine = 1
  c.delta.scope = 'batch'

  # Optimisation (paper Appendix I: AdamW, warm-up 3%, cosine to 0.2 of peak, no entropy bonus).
  c.learning_rate = 2e-4               # peak; the paper's 8e-7 is for 32B models
  c.warmup_frac = 0.03
  c.min_lr_ratio = 0.2
  c.weight_decay = 0.0
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.grad_clip = 1.0
  c.ppo_epochs = 1                     # mu: passes over each rollout batch
  c.minibatch_prompts = 8              # groups per update step (whole groups stay together)
  c.behaviour_logps = 'recompute'      # recompute | sampler: old log-probs for the ratios

  # Memory and scale (see docs/scaling.md).
  c.param_dtype = ''                   # master weights + optimiser state: float32 | bfloat16
                                       # ('' = the policy's own)
  c.compute_dtype = ''                 # activations / matmuls ('' = the policy's own); log-probs
                                       # are float32 whatever this is
  c.microbatch_prompts = 0             # gradient accumulation: groups per micro-batch (0 = off,
                                       # else a divisor of minibatch_prompts); same update
  c.remat = False                      # jax.checkpoint every Transformer block in the update
  c.rollout_chunk_prompts = 0          # sample / score this many prompts at a time (0 = all):
                                       # bounds the KV cache and the behaviour-pass activations
  c.ref_param_dtype = ''               # dtype of the frozen KL reference (kept only if kl_coef > 0)

  # DAPO options.
  c.dynamic_sampling = False           # drop zero-variance groups and refill the batch
  c.dynamic_sampling_rounds = 3        # at most this many extra rollout rounds per step
  c.mask_truncated = False             # overlong filtering: truncated completions get no gradient
  c.overlong_buffer = 0                # soft overlong punishment over the last N tokens (0 = off)
  c.overlong_penalty = 1.0

  # Compute-matched runs.
  c.token_budget = 0                   # stop once this many tokens were generated (0 = off)

  # Evaluation: avg@k accuracy on held-out problems.
  c.eval_every = 50
  c.eval_problems = 256
  c.eval_k = 4
  c.eval_temperature = 1.0
  c.eval_top_k = 0
  c.eval_top_p = 1.0
  c.eval_min_p = 0.0

  # Logging and checkpoints.
  c.log_every = 1
  c.diagnostics_every = 10             # jtc.diagnostics.step_diagnostics (0 = off)
  c.diagnostics_mode = 'proxy'         # proxy (LM-head gradient norms) | exact (small models)
  c.ckpt_every = 25
  c.keep_checkpoints = 3
  c.mesh_data = -1                     # devices on the data axis (-1 = all remaining)
  c.mesh_fsdp = 1                      # devices sharding params + optimiser state (FSDP) and batch
  c.mesh_tensor = 1                    # devices sharding heads / MLP / vocab (tensor parallel)

  if args.get('runlocal'):
    c.num_steps = 10
    c.prompts_per_step = 8
    c.minibatch_prompts = 4
    c.eval_every = 5
    c.eval_problems = 32
    c.ckpt_every = 5
  if args.get('smoke'):
    c.num_steps = 2
    c.prompts_per_step = 2
    c.group_size = 4
    c.minibatch_prompts = 1
    c.max_new_tokens = 24
    c.eval_every = 2
    c.eval_problems = 4
    c.eval_k = 2
    c.ckpt_every = 1
    c.diagnostics_every = 1
  return c
