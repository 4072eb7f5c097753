"""Shared defaults for every RL config in `configs/`, one section per consumer.

A method config is `common.get_config(arg)` with `loss` (and, for DelTA, `token_weights` and
`delta`) filled in; a method config changes the method and nothing else. Defaults follow the
paper's Appendix I where it applies (AdamW, linear warm-up over 3% of the updates, cosine decay
to 0.2 of the peak learning rate, no entropy bonus) scaled to the tiny default policy that ships
with jtc (`jtc/assets/base_policy`). Every field is overridable from the command line, e.g.
`--config.optim.learning_rate=1e-4 --config.rollout.sampling.num_samples=16`.

Sections and who reads them (each checked by its reader's `check_config`, before any compute;
`jtc.rl.step.build` turns policy, lora, population, loss, delta, optim and mesh into the RL step):
  seed, num_steps, token_budget                                        (jtc.rl.trainer)
  policy     where the weights come from and how they are held        (jtc.rl.checkpoints)
  lora       low-rank adapters on the frozen policy (rank 0 = off)      (jtc.models.lora)
  data       task or dataset, verifier, prompt encoding                (jtc.data.pipeline,
             jtc.data.rewards, jtc.rl.rollout)
  rollout    prompts per step, chunking, policy lag, the sampler's dtype and mismatch correction;
             `sampling` goes straight to jtc.models.sampler.sample      (jtc.rl.rollout,
             jtc.rl.batch)
  advantage  group-relative advantages                                  (jtc.objectives.advantages)
  loss       the objective and its hyper-parameters                     (jtc.objectives)
  token_weights, delta  a token-weight plug-in (DelTA's options)        (jtc.objectives.token_weights)
  optim      optimiser, PPO epochs, mini- and micro-batches             (jtc.rl.update)
  dapo       DAPO's data-side options                                   (jtc.rl.rollout, jtc.rl.batch)
  eval       held-out avg@k; `sampling` has the rollout's field names   (jtc.rl.evaluation)
  log        progress, diagnostics, the ledger, checkpoints, W&B        (jtc.rl.trainer,
             jtc.analysis.tracking)
  population seeds and varied hyper-parameters trained as one program   (jtc.rl.population)
  mesh       device mesh                                                 (jtc.rl.sharding)
  distributed  multi-process start-up                                    (jtc.rl.distributed)

Args accepted by every method config (comma separated, e.g. `configs/gspo.py:smoke`):
  smoke     a few-second run for tests: 2 steps, 2 prompts x 4 samples, short completions.
  runlocal  a one-minute run for eyeballing a change.
"""

import ml_collections

ConfigDict = ml_collections.ConfigDict


def parse_arg(arg):
  """`'smoke,runlocal'` -> {'smoke': True, 'runlocal': True}."""
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
  hparams = {
      k: ml_collections.config_dict.placeholder(float) if v is None else v
      for k, v in hparams.items()
  }
  c.loss.name = name
  c.loss.hparams = ConfigDict(hparams)


def sampling(num_samples, max_new_tokens, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
  """A `sampling` section: the keyword arguments of `jtc.models.sampler.sample`."""
  return ConfigDict(
      dict(num_samples=num_samples, max_new_tokens=max_new_tokens, temperature=temperature,
           top_k=top_k, top_p=top_p, min_p=min_p))


def get_config(arg=None):
  """The defaults; method configs override `loss` (and `token_weights`, `delta`)."""
  args = parse_arg(arg)
  c = ConfigDict()
  c.seed = 0
  c.num_steps = 200  # RL steps (one rollout batch each)
  c.token_budget = 0  # stop once this many tokens were generated (0 = off)

  c.policy = ConfigDict()
  # A jtc policy bundle: 'base' (shipped, arithmetic), 'phrasing' (shipped), 'moe' (shipped,
  # arithmetic, a mixture of experts) or a directory written by `python -m jtc.sft`.
  c.policy.init = 'base'
  # A Hugging Face model dir (Qwen3/Qwen2/Llama) instead: weights, tokenizer, chat template and
  # eos/pad ids from it.
  c.policy.checkpoint = ''
  c.policy.overrides = ConfigDict()  # ModelConfig fields, e.g. .overrides.dtype=bfloat16
  c.policy.param_dtype = ''  # master weights + AdamW state: float32 | bfloat16 | ''
  c.policy.compute_dtype = ''  # matmuls (log-probs are float32 whatever this is)
  c.policy.remat = False  # jax.checkpoint every Transformer block in the update
  c.policy.ref_param_dtype = ''  # dtype of the frozen KL reference (kept only if kl_coef > 0)
  # The trunk's attention (jtc.models.attention): auto | dense | blockwise | splash; 'auto' picks
  # for the devices that run it (CPU: dense; TPU, GPU: blockwise, no [L, L] scores).
  c.policy.attention = 'auto'
  # A mixture of experts on mesh.expert > 1 devices (jtc.models.moe_dispatch): 'replicated' (the
  # tokens stay whole along the expert axis) | 'all_to_all' (split over it and sent to their
  # experts' devices with an all-to-all, expert parallelism's token exchange).
  c.policy.moe_dispatch = 'replicated'
  # A ModelConfig preset (e.g. 'qwen3_8b') `python -m jtc.plan` plans with when no checkpoint
  # is given: the architecture without the weights.
  c.policy.preset = ''

  c.lora = ConfigDict()  # jtc.models.lora: low-rank adapters trained on the frozen policy
  c.lora.rank = 0  # r of every adapter (0 = full fine-tuning, no adapters)
  c.lora.alpha = 8.0  # the adapters' output is scaled by alpha / rank
  c.lora.targets = 'q,k,v,o,gate,up,down'  # adapted projections, comma separated

  c.data = ConfigDict()
  c.data.task = 'arithmetic'  # a name from jtc.data.tasks
  # A dataset instead of a task (jtc.data.formats, docs/data.md; `jtc data PATH` shows how it
  # is read): a JSONL or verl-style parquet file, a dir of <split>.jsonl / <split>.parquet, or a
  # Hugging Face dataset saved with save_to_disk. verl rows: chat messages in 'prompt', answer
  # reward_model.ground_truth; question/answer rows: GSM8K '#### x', MATH '\boxed{x}' understood.
  # Several files, as verl's lists: 'a.parquet,b.parquet' or a glob 'dapo/part-*.parquet' (one
  # split, the files read in that order; jtc.data.file_lists).
  c.data.dataset = ''
  c.data.eval_dataset = ''  # held-out dataset (a path, list or glob as data.dataset) (docs/data.md)
  c.data.train_split = ''  # the dataset's split that trains ('' = 'train', else its only split)
  # The held-out split: of eval_dataset ('' = its 'test', else its only split), else of dataset
  # ('' = its 'test' split when it has one).
  c.data.eval_split = ''
  # Without a held-out split: hold out this fraction of the training rows (0 = none: no
  # evaluation), drawn by a permutation of data.split_seed, the same for every run seed.
  c.data.eval_fraction = 0.0
  c.data.split_seed = 0
  # Question/answer field names of the dataset's rows ('' = the first present of
  # question/problem/prompt/query and answer/solution/response); naming one reads even a verl
  # file as question/answer rows.
  c.data.question_field = ''
  c.data.answer_field = ''
  c.data.data_dir = ''  # '' = $JTC_DATA_DIR or ~/.cache/jtc/data
  # A jtc.data.rewards verifier ('' = the task's own): exact_match | numeric_match | boxed_numeric
  # | format | expression_match | gsm8k_strict (verl's GSM8K rule) | math_verify (Math-Verify,
  # the optional 'math' extra; a pool of processes, docs/verifiers.md).
  c.data.reward = ''
  # A function as verl or TRL define rewards, unchanged: data.reward='MODULE:FUNCTION' (a module
  # on the path or path/to/file.py), called as verl | trl | trl_chat (jtc.data.custom_rewards;
  # docs/verifiers.md); it runs in the verifier pool, a failure scores 0 and is counted.
  c.data.reward_signature = 'verl'
  # 'SOURCE=REWARD;SOURCE=REWARD': a verifier per data_source of the rows, as verl dispatches
  # ('' = data.reward for every row), e.g. 'openai/gsm8k=gsm8k_strict;aime=math_verify'.
  c.data.reward_by_source = ''
  c.data.verify_workers = 4  # worker processes of math_verify / a user's function (per run)
  c.data.verify_timeout_s = 10.0  # pooled verifiers: an answer not checked within this scores 0
  c.data.prompt_width = 20  # P: prompts (with BOS) are left-padded to this width
  # A prompt longer than prompt_width (jtc.data.overlong): error | drop (left out, counted before
  # the run) | truncate (its first tokens after BOS cut, never its last user turn; counted).
  c.data.overlong = 'error'
  c.data.prompt_suffix = ''  # appended to every question before the chat template
  c.data.chat_template = True  # wrap prompts with the tokenizer's chat template

  c.rollout = ConfigDict()
  c.rollout.prompts_per_step = 16  # groups per RL step
  c.rollout.chunk_prompts = 0  # prompts per sampler / scoring call (0 = all at once)
  # Prompts per behaviour / reference pass when it must differ from the sampler's chunk (a
  # 32k-token forward pass holds far more activations per row than a decode step): 0 = chunk_prompts.
  c.rollout.score_chunk_prompts = 0
  c.rollout.behaviour_logps = 'recompute'  # recompute | sampler: old log-probs for the ratios
  # Rollout-training mismatch correction (jtc.objectives.corrections): none | tis | mis | icepop |
  # seq_tis | seq_mask, weighing the recomputed behaviour policy against the sampler's.
  c.rollout.correction = 'none'
  c.rollout.correction_cap = 2.0  # C: tis truncates at C, the masks keep [1/C, C]
  c.rollout.icepop_low = 0.5  # icepop keeps rho in [low, high] (IcePop's defaults)
  c.rollout.icepop_high = 5.0
  c.rollout.sampler_dtype = ''  # '' (the policy's) | bfloat16 | float32: the sampler's matmuls
  # Asynchronous RL's off-policy data: sample step t's rollouts with the parameters of step
  # t - policy_lag (kept, never recomputed; 0 = the synchronous trainer). The ratios are then
  # taken against that behaviour policy ('behaviour'), or, 'decoupled' (decoupled PPO), the clip
  # is centred on the current parameters while pi_current / pi_behaviour weighs each token.
  c.rollout.policy_lag = 0
  c.rollout.policy_lag_mode = 'behaviour'
  # A mixture-of-experts policy's routing replay (jtc.rl.routing): none | behaviour (the
  # completion tokens go to the sampler's experts in the behaviour pass and every update) | all
  # (the prompt's too, to the prefill's).
  c.rollout.routing_replay = 'none'
  c.rollout.sampling = sampling(8, 32)  # G completions per prompt, T new tokens, temperature 1
  # Which rows a decode step runs (jtc.models.decode_loop; the same samples either way): static
  # (every row until the last has ended) | continuous (decode_slots slots, each taking the next
  # (prompt, sample) pair when its row ends: no step waits on the longest answer).
  c.rollout.scheduler = 'static'
  # The continuous scheduler's slots (None: as many as half the devices' free memory holds, at
  # most the rows of a sampler call; fewer slots than rows is where it gains; jtc plan prints
  # the count, jtc.rl.decoding).
  c.rollout.decode_slots = ml_collections.config_dict.placeholder(int)
  # The weights' layout while decoding (jtc.rl.sharding.decode_layout): tensor (resharded once per
  # sampler call, whole over the data/fsdp axes: no per-step gathers) | fsdp (the training layout,
  # gathered at every decode step) | auto (tensor where a chip's share fits a quarter of its
  # free memory; jtc plan prints which and why).
  c.rollout.decode_layout = 'auto'
  # Partial rollouts (jtc.rl.partial; 0 = off): sampler calls stop after this many decode steps;
  # a step trains on the first prompts_per_step complete groups and carries the unfinished rows
  # to later steps (continued, re-prefilled, under newer parameters). Needs scheduler=continuous
  # and behaviour_logps=sampler.
  c.rollout.max_decode_steps = 0

  c.advantage = ConfigDict()
  c.advantage.name = 'grpo'  # grpo | dr_grpo | rloo
  c.advantage.eps = 1e-6
  c.advantage.std_ddof = 0
  c.advantage.batch_normalize = False
  # both | positive | negative: train on the advantages of one sign only (positive: the
  # Cancellation Hypothesis's positive-only control; jtc.objectives.advantages.keep_sign).
  c.advantage.sign = 'both'

  c.loss = ConfigDict()  # jtc.objectives.compute_loss: name + hyper-parameters
  c.loss.name = 'grpo'
  c.loss.hparams = ConfigDict()
  # A mixture-of-experts policy's load-balancing loss (jtc.models.moe) added with this weight
  # (Hugging Face's router_aux_loss_coef; 0: logged as router_aux, not trained on).
  c.loss.router_aux_coef = 0.0

  c.token_weights = ''  # '' | 'delta': a plug-in producing per-token loss weights
  c.delta = ConfigDict()  # its options (jtc.objectives.delta.options_for)
  c.delta.ablation = 'full'  # a name in jtc.objectives.delta.DELTA_ABLATIONS
  c.delta.lam_min = 0.8
  c.delta.lam_max = 1.2
  c.delta.num_refine = 1
  c.delta.scope = 'batch'
  # Where the coefficient pass's hidden states come from, a memory/compute knob like remat
  # (jtc.objectives.delta_recompute): 'held', the behaviour pass returns the step's [B, T, D]
  # hidden states and they live until DelTA's pass; 'recomputed', none are returned and each of
  # DelTA's 2K + 2 passes recomputes them, rollout.score_chunk_prompts x G rows at a time
  # (2K + 2 more forward passes; one chunk's [R, T, D] at a time). Valid: 'held', 'recomputed'.
  c.delta.hidden = 'held'

  c.optim = ConfigDict()  # paper Appendix I: AdamW, warm-up 3%, cosine to 0.2 x peak
  c.optim.learning_rate = 2e-4  # peak; the paper's 8e-7 is for 32B models
  c.optim.warmup_frac = 0.03
  c.optim.min_lr_ratio = 0.2
  c.optim.weight_decay = 0.0
  c.optim.adam_b1 = 0.9
  c.optim.adam_b2 = 0.999
  c.optim.grad_clip = 1.0  # global-norm clip (0 = off)
  c.optim.ppo_epochs = 1  # mu: passes over each rollout batch
  c.optim.minibatch_prompts = 8  # groups per optimiser step (whole groups stay together)
  # Which rollouts share a mini-batch (jtc.rl.minibatch_order): group (whole groups, the
  # Cancellation Hypothesis's query-preserved batching) | shuffled (rows, a group spread over the
  # mini-batches) | reward_balanced (rows, positive and negative advantages split evenly).
  c.optim.minibatch_order = 'group'
  c.optim.microbatch_prompts = 0  # groups per micro-batch (gradient accumulation; 0 = off)

  c.dapo = ConfigDict()
  c.dapo.dynamic_sampling = False  # drop zero-variance groups and refill the batch
  c.dapo.dynamic_sampling_rounds = 3  # at most this many extra rollout rounds per step
  c.dapo.mask_truncated = False  # overlong filtering: truncated completions get no gradient
  c.dapo.overlong_buffer = 0  # soft overlong punishment over the last N tokens (0 = off)
  c.dapo.overlong_penalty = 1.0

  c.eval = ConfigDict()  # held-out avg@k
  c.eval.every = 50  # RL steps between evaluations (0 = never)
  c.eval.problems = 256
  # Prompts per evaluation sampler call. The draws depend on it (and on the seed, the problems
  # and `sampling`), never on the training batch, so runs of any rollout shape evaluate with
  # common random numbers; 16 is the default rollout batch, whose evaluations it reproduces.
  c.eval.batch_prompts = 16
  c.eval.sampling = sampling(4, 32)  # k samples per problem, T new tokens, temperature 1
  c.eval.probe_problems = 64  # problems of the exact format probe (Cor. 3.2; 0 = off)

  c.log = ConfigDict()
  c.log.diagnostics_every = 10  # jtc.analysis.diagnostics.step_diagnostics (0 = off)
  c.log.diagnostics_mode = 'proxy'  # proxy (LM-head gradient norms) | exact (small models)
  c.log.ckpt_every = 25
  c.log.keep_checkpoints = 3
  c.log.progress_every = 10  # a progress line when stderr is not a terminal
  # The per-token ledger (jtc.analysis.ledger) every N steps (0 = never): each token's
  # coefficient, ratio, flags, and the parameters before each update (for replay).
  c.log.ledger_every = 0
  # Sample generations (jtc.analysis.samples) every N steps (0 = never): the first completion of
  # the step's first log.samples prompts (prompt, completion, reward, answer, data_source) in
  # <run dir>/samples.jsonl and a W&B table. On by default: they are rollouts already sampled and
  # scored (nothing drawn or computed; results unchanged), a few KB each time.
  c.log.samples_every = 50
  c.log.samples = 4
  # Weights & Biases (jtc.analysis.tracking; pip install -e ".[wandb]"): every metrics.jsonl
  # record at its step, the config and the code revision, W&B's files in <workdir>/wandb (a
  # population: one run per member, grouped under the run name). '' = off.
  c.log.wandb_project = ''
  c.log.wandb_entity = ''  # W&B user or team ('' = the account's default)
  c.log.wandb_run_name = ''  # '' = the workdir's name (a member's run: '<name>/<member>')
  c.log.wandb_tags = ''  # comma separated, e.g. 'gspo,sweep3'
  # '' (auto: $WANDB_MODE if set, else online with an API key, offline without one) | online |
  # offline (`wandb sync <workdir>/wandb/offline-run-*` uploads later) | disabled. 'online'
  # without a key (WANDB_API_KEY or `wandb login`) is refused.
  c.log.wandb_mode = ''

  c.population = ConfigDict()  # jtc.rl.population: N members trained by one program
  c.population.size = 1  # seeds per setting: seed, seed + 1, ..., seed + size - 1
  # 'KEY=v1,v2[;KEY2=w1,w2]': per-member values crossed with the seeds; KEY is
  # optim.learning_rate, rollout.sampling.temperature or a float of loss.hparams.
  c.population.vary = ''

  c.mesh = ConfigDict()
  c.mesh.population = 1  # devices the population's members are sharded over
  c.mesh.data = -1  # devices on the data axis (-1 = all remaining)
  c.mesh.fsdp = 1  # devices sharding params + optimiser state (FSDP) and batch
  c.mesh.tensor = 1  # devices sharding heads / MLP / vocab (tensor parallel)
  # devices sharding a mixture-of-experts policy's experts (expert parallel; must divide them)
  c.mesh.expert = 1

  c.distributed = ConfigDict()  # several processes (JAX_COORDINATOR_ADDRESS, ...); else unused
  # Seconds the processes have to reach each other at start-up before failing with what was
  # tried (0 = $JTC_COORDINATOR_TIMEOUT_S, else 300).
  c.distributed.coordinator_timeout_s = 0

  if args.get('runlocal'):
    c.num_steps = 10
    c.rollout.prompts_per_step = 8
    c.optim.minibatch_prompts = 4
    c.eval.every = 5
    c.eval.problems = 32
    c.eval.batch_prompts = 8
    c.log.ckpt_every = 5
  if args.get('smoke'):
    c.num_steps = 2
    c.rollout.prompts_per_step = 2
    c.rollout.sampling.num_samples = 4
    c.rollout.sampling.max_new_tokens = 24
    c.eval.sampling.max_new_tokens = 24
    c.optim.minibatch_prompts = 1
    c.eval.every = 2
    c.eval.problems = 4
    c.eval.batch_prompts = 2
    c.eval.sampling.num_samples = 2
    c.eval.probe_problems = 4
    c.log.ckpt_every = 1
    c.log.diagnostics_every = 1
    c.log.samples_every = 1
  return c
