r"""The RL trainer: config-driven runs of every intra-group objective, one run or a seed population.

  python -m jtc.train --config configs/<method>.py[:smoke|runlocal] --workdir W [--config.key=value]
  python -m jtc.train --config configs/gspo.py --config.population.size=8 --workdir W

Methods: one config file each in configs/; every key is documented in configs/common.py.

One RL step (`Trainer.step`), each stage handing the next a typed value:
  prompts -> `rollout.collect` (G samples per prompt, rewards, DAPO refill)     -> Rollout
  -> advantages -> behaviour pass (+ token weights, e.g. DelTA)                -> update.Batch
  -> ppo_epochs x mini-batches of `update.update_step` (jitted, donated)       -> metrics.
A population (`jtc.rl.population`) runs the same stages for E members at once: host values are
lists of E (one `Rollout`, one metrics dict per member), device values carry a leading member
axis and the jitted functions are vmapped over it; with E = 1 nothing changes.

Real models (configs/real/): `--config.policy.checkpoint=DIR` loads a Hugging Face Llama/Qwen
directory; `--config.data.dataset=FILE.jsonl` reads question/answer records (docs/scaling.md).

A workdir holds one run or one population: checkpoints (train state, run state, data-iterator
states, config); `metrics.jsonl` (one line per step), TensorBoard events and config.json in the
workdir (a run) or in each member's ``members/<name>/`` (a population), and with
`log.wandb_project` a Weights & Biases run of each (`jtc.analysis.tracking`); started again, it
resumes exactly.

Dimension key: B rollout sequences (= prompts_per_step * G), G group size, P prompt width,
T max new tokens, L = P + T, V vocabulary, E population members (docs/dimensions.md).
"""

import dataclasses
import functools
import itertools
import json
import os
import sys
import time

import jax
import numpy as np

from jtc.analysis import diagnostics
from jtc.analysis import metric_writer
from jtc.analysis import probes
from jtc.analysis import tracking
from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.data import traps
from jtc.data import verifiers
from jtc.models import lora as lora_lib
from jtc.objectives import token_weights
from jtc.rl import batch as batch_lib
from jtc.rl import checkpoints
from jtc.rl import config_check
from jtc.rl import distributed
from jtc.rl import evaluation
from jtc.rl import ledger_recorder
from jtc.rl import loop
from jtc.rl import population as population_lib
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import update as update_lib
from jtc.rl import workdir as workdir_lib


class Trainer:
  """A run's (or a population's) compiled functions and state; `run()` is the loop.
  `policy=(model_config, params, tokenizer)` replaces the config's policy (tests, benchmarks)."""

  def __init__(self, config, workdir, *, policy=None, allow_config_change=False):
    config_check.validate(config)
    self.c, self.workdir = config, workdir
    self.pop = population_lib.Population.of(config)
    # In a multi-process run process 0 alone holds the lock and writes what a run writes once.
    self.primary = distributed.is_primary()
    self._lock, schedule_steps = workdir_lib.claim(workdir, config,
                                                   allow_changes=allow_config_change,
                                                   take_lock=self.primary)
    try:
      self._build(schedule_steps, policy)
    except BaseException:
      if getattr(self, 'gen', None) is not None:  # the verifier's processes, if it started any
        self.gen.close()
      if self._lock is not None:  # another trainer (or this one, fixed) may use the workdir
        self._lock.close()
      raise

  def _build(self, schedule_steps, policy):
    c, pop = self.c, self.pop
    self.model_config, params, self.tokenizer = policy or checkpoints.load_policy(c.policy)
    config_check.validate_policy(c, self.model_config, pop.n)  # LoRA, MoE keys vs the model
    self.G, self.P = c.rollout.sampling.num_samples, c.data.prompt_width
    self.task = None if c.data.dataset else tasks_lib.get_task(c.data.task)
    self.updates_per_step = update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step)
    total_updates = schedule_steps * self.updates_per_step
    self.schedules = [  # each member's learning rate, logged
        update_lib.learning_rate_schedule(c.optim, total_updates,
                                          dict(m.values).get('optim.learning_rate'))
        for m in pop.members
    ]
    optimizer = update_lib.make_optimizer(c.optim, total_updates)
    self.hparams = pop.varied()  # the varied keys' per-member values, traced in the step
    self.mesh = sharding_lib.make_mesh(**sharding_lib.mesh_sizes(**c.mesh))
    print(
        f'mesh {dict(self.mesh.shape)}: {jax.device_count()} devices, {jax.process_count()} '
        f'processes' + (f', {pop.n} population members' if pop.batched else ''), file=sys.stderr)
    self.frozen = self.frozen_sh = None  # a LoRA run's base, one copy shared by every member
    if c.lora.rank:
      base_sh = sharding_lib.param_shardings(params, self.mesh)
      frozen = lambda base: lora_lib.Adapted(base, None, scale=lora_lib.scale(c.lora))
      self.frozen = frozen(jax.tree.map(sharding_lib.to_device, params, base_sh))
      self.frozen_sh = frozen(base_sh)
      params = jax.device_get(  # what is trained (and checkpointed): the adapters alone
          lora_lib.init_adapters(self.model_config, rank=c.lora.rank,
                                 targets=lora_lib.parse_targets(c.lora.targets)))
    param_sh = sharding_lib.param_shardings(params, self.mesh, members=pop.n if pop.batched else 0)
    self.state, self.state_sh = update_lib.init_state(params, optimizer, param_shardings=param_sh,
                                                      replicated=sharding_lib.replicated(self.mesh),
                                                      population=pop)
    self.ref_params = None
    kl = [
        dict(m.values).get('loss.hparams.kl_coef', c.loss.hparams.get('kl_coef'))
        for m in pop.members
    ]
    if any(kl) and self.frozen is not None:  # with LoRA the reference is the base alone: free
      self.ref_params = self.frozen
    elif any(kl):  # a frozen copy, never aliased with the donated state
      self.ref_params = checkpoints.frozen_copy(
          self.state.params, c.policy.ref_param_dtype or self.model_config.param_dtype, param_sh)
    # Sampling and the behaviour pass never differentiate: no rematerialisation there.
    infer_config = dataclasses.replace(self.model_config, remat=False)
    sampler_config = infer_config  # the sampler's compute dtype may differ (a planted mismatch)
    if c.rollout.sampler_dtype:
      sampler_config = dataclasses.replace(infer_config, dtype=c.rollout.sampler_dtype)
    self.gen = rollout_lib.Generator.from_config(c, sampler_config, self.tokenizer, self.task,
                                                 to_device=self._to_device, population=pop,
                                                 mesh=self.mesh)
    # Held-out evaluation samples from the policy as trained, whatever the rollouts' sampler.
    self.eval_gen = dataclasses.replace(self.gen, model_config=infer_config)
    self.weighter = (token_weights.PLUGINS[c.token_weights].from_config(
        c.delta, group_size=self.G, model_config=self.model_config) if c.token_weights else None)
    run_state = pop.stack([
        update_lib.RunState.init(self.model_config.vocab_size,
                                 self.weighter.init_state() if self.weighter else None)
        for _ in pop.members
    ])
    # Its device arrays replicated over the mesh (every process's devices), so that a restored
    # run state lands where the step's arrays are.
    replicated = sharding_lib.replicated(self.mesh)
    self.run_state = jax.tree.map(
        lambda x: x
        if isinstance(x, np.ndarray) else sharding_lib.to_device(np.asarray(x), replicated),
        run_state)
    if c.rollout.policy_lag:  # every lagged slot starts at the initial policy
      self.run_state = self.run_state.replace(lagged_params=tuple(
          self._copy_params() for _ in range(c.rollout.policy_lag)))
    self.train_iters, self.eval_examples, prompts = data_lib.run_data(
        c.data, batch_size=c.rollout.prompts_per_step, seeds=[m.seed for m in pop.members],
        eval_problems=c.eval.problems)
    self.gen.check_prompt_width(prompts)
    for line in traps.for_run(c.data, self.gen.reward_fn) if self.primary else ():
      print(line, file=sys.stderr)  # two answer formats; a verifier that cannot read the data
    self.ckpt = checkpoints.TrainCheckpointer(os.path.join(self.workdir, 'checkpoints'),
                                              max_to_keep=c.log.keep_checkpoints)
    self._restore()
    self.member_dirs = population_lib.record(self.workdir, c, schedule_steps, pop,
                                             write=self.primary)
    lr_varies = 'optim.learning_rate' in self.hparams
    self._build_jits(
        infer_config,
        functools.partial(update_lib.make_optimizer, c.optim, total_updates)
        if lr_varies else optimizer)
    from jtc.plan import preflight  # pylint: disable=import-outside-toplevel
    # Every stage fits, before any rollout (compiled by the functions the steps then call).
    preflight.check(c, self.model_config, self.mesh, behaviour_fn=self._behaviour,
                    update_fn=self._update, tokenizer=self.tokenizer)

  def _policy(self, params):
    """The policy of trained ``params``: themselves, or a LoRA run's adapters on its base."""
    return params if self.frozen is None else self.frozen.replace(adapters=params)

  def _copy_params(self):
    """The current parameters in new buffers (the update donates the state's)."""
    return checkpoints.frozen_copy(self.state.params, self.model_config.param_dtype,
                                   self.state_sh.params)

  def _to_device(self, x):
    sharding = sharding_lib.batch_sharding(self.mesh, np.shape(x), members=self.pop.batched)
    return sharding_lib.to_device(x, sharding)

  def _build_jits(self, infer_config, optimizer):
    c, pop = self.c, self.pop
    self._behaviour = rollout_lib.jit_behaviour(
        infer_config, completion_start=self.P, return_hidden=bool(self.weighter and
                                                                  self.weighter.needs_hidden),
        population=pop, mesh=self.mesh)
    self._minibatch, self._update = update_lib.jit_minibatch_and_update(
        c, self.model_config, optimizer, self.mesh, self.state_sh, pop, self.frozen_sh)

    def diagnose(params, batch, hparams, token_counts):
      prefix = 'loss.hparams.'
      loss_hparams = {
          **c.loss.hparams.to_dict(),
          **{
              k[len(prefix):]: v for k, v in hparams.items() if k.startswith(prefix)
          }
      }
      return diagnostics.step_diagnostics(params, infer_config, batch, loss_name=c.loss.name,
                                          loss_hparams=loss_hparams, group_size=self.G,
                                          completion_start=self.P, token_counts=token_counts,
                                          mode=c.log.diagnostics_mode)

    self._diagnostics = jax.jit(pop.map(diagnose))
    self._merged = jax.jit(pop.map(lambda policy: policy.merged()))  # LoRA ledger params
    self._ledger_columns = ledger_recorder.make_columns_fn(c, infer_config, pop)

  def step(self, step):
    """Rollout -> batch -> updates for RL step ``step``; returns each member's metrics."""
    c, pop = self.c, self.pop
    keys = [
        jax.random.split(jax.random.fold_in(jax.random.key(m.seed), step), 3) for m in pop.members
    ]
    k_rollout, k_order, k_weights = (pop.stack([k[i] for k in keys]) for i in range(3))
    # Under a policy lag of k steps the rollouts come from the parameters of step - k (the
    # initial ones for the first k steps), as an asynchronous trainer's would.
    lagged = self.run_state.lagged_params
    behaviour_params = lagged[0] if lagged else self.state.params
    t0 = time.perf_counter()
    rollouts, rounds = rollout_lib.collect(
        self.gen, self._policy(behaviour_params),
        [functools.partial(next, it) for it in self.train_iters], k_rollout,
        sampling=c.rollout.sampling.to_dict(), dynamic_sampling=c.dapo.dynamic_sampling,
        max_rounds=c.dapo.dynamic_sampling_rounds,
        temperature=self.hparams.get('rollout.sampling.temperature'))
    self.rollouts = rollouts  # the step's rollouts, one per member (for inspection)
    t1 = time.perf_counter()
    batch, metrics, self.run_state = batch_lib.make_batch(
        c, rollouts, self._policy(behaviour_params), self.run_state, task=self.task,
        behaviour_fn=self._behaviour, ref_params=self.ref_params, to_device=self._to_device,
        weighter=self.weighter, rng=k_weights, population=pop,
        proximal_params=self._policy(self.state.params) if lagged else None)
    if lagged:  # this step's parameters join the lag, the oldest leave it
      self.run_state = self.run_state.replace(lagged_params=lagged[1:] + (self._copy_params(),))
    jax.block_until_ready(batch.old_logps_BT)
    t2 = time.perf_counter()
    diagnose = c.log.diagnostics_every and step % c.log.diagnostics_every == 0
    recorder = None
    if c.log.ledger_every and step % c.log.ledger_every == 0:
      recorder = ledger_recorder.LedgerRecorder(self._ledger_columns, batch, pop)
    update_fn = self._update if self.frozen is None else (
        lambda state, mb, hparams: self._update(state, mb, hparams, self.frozen))
    counts_V = self.run_state.token_counts_V
    self.state, update_metrics = update_lib.run_updates(
        self.state, batch, k_order, self.hparams, update_fn=update_fn, minibatch_fn=self._minibatch,
        num_groups=c.rollout.prompts_per_step, minibatch_prompts=c.optim.minibatch_prompts,
        ppo_epochs=c.optim.ppo_epochs, group_size=self.G,
        population=pop, diagnose_fn=(lambda params, mb, hparams: self._diagnostics(
            self._policy(params), mb, hparams, token_counts=counts_V)) if diagnose else None,
        before_update=self._ledger_hook(recorder))
    t3 = time.perf_counter()
    n_tokens = [int(r.completion_mask_BT.sum()) for r in rollouts]
    self.run_state = self.run_state.add(
        rl_steps=1, generated_tokens=pop.stack([np.int64(n) for n in n_tokens]),
        rollouts=rollouts[0].rewards_B.shape[0], update_steps=self.updates_per_step,
        prompts=pop.stack([np.int64(c.rollout.prompts_per_step * (1 + r)) for r in rounds]))
    counts = {k: pop.unstack(np.asarray(self.run_state.count(k))) for k in update_lib.COUNTERS}
    rates = [float(self.schedules[m](counts['update_steps'][m] - 1)) for m in range(pop.n)]
    if recorder:  # every process takes part (gathers); process 0 writes
      recorder.write(step, run_dirs=self.member_dirs, rollouts=rollouts, tokenizer=self.tokenizer,
                     c=c, model_config=self.model_config, learning_rates=rates, files=self.primary)
    failures = verifiers.take_metrics(self.gen.reward_fn)  # a user's reward function's
    for m in range(pop.n):
      metrics[m].update(update_metrics[m], **failures)
      metrics[m].update(dynamic_sampling_rounds=rounds[m], time_sample=t1 - t0, time_score=t2 - t1,
                        time_update=t3 - t2, tokens_per_s=n_tokens[m] / max(t3 - t0, 1e-9),
                        learning_rate=rates[m], **{
                            f'compute/{k}': int(v[m]) for k, v in counts.items()
                        })
    return metrics

  def _ledger_hook(self, recorder):
    """`run_updates`'s before_update for ``recorder`` (None: none); a LoRA run's ledger keeps
    the merged parameters (base + scaled A B), which replay as a plain policy."""
    if recorder is None or self.frozen is None:
      return recorder and recorder.before_update
    return lambda k, params, rows: recorder.before_update(k, self._policy(params), rows, stored=self
                                                          ._merged(self._policy(params)))

  def evaluate(self, step):
    """Each member's avg@k on the held-out problems at the config's evaluation decoding."""
    c, pop = self.c, self.pop
    t0 = time.perf_counter()
    keys = pop.keys(lambda m: jax.random.fold_in(jax.random.key(m.seed + 1), step))
    outs = evaluation.evaluate(self.eval_gen, self._policy(self.state.params), self.eval_examples,
                               keys, sampling=c.eval.sampling.to_dict(),
                               batch_prompts=c.eval.batch_prompts, task=self.task)
    if self.task is not None and c.eval.probe_problems:  # exact drift between equivalent forms
      replicated = sharding_lib.replicated(self.mesh)
      for m, out in enumerate(outs):
        params = self._policy(pop.member(self.state.params, m, replicated))
        out.update({
            f'probe/{k}': v for k, v in probes.format_probe(
                params, self.eval_gen.model_config, self.tokenizer,
                self.eval_examples[:c.eval.probe_problems], self.task.formats, prompt_width=self.P,
                scaffold=self.task.scaffold, chat_template=c.data.chat_template,
                prompt_suffix=c.data.prompt_suffix).items()
        })
    seconds = time.perf_counter() - t0
    return [dict({f'eval/{k}': v for k, v in out.items()}, time_eval=seconds) for out in outs]

  def _restore(self):
    restored = self.ckpt.restore_latest(self.state, self.run_state)
    if restored is not None:
      self.state, self.run_state, extra = restored
      states = extra['data_states'] if self.pop.batched else [extra['data_state']]
      for it, state in zip(self.train_iters, states):
        it.set_state(state)
      print(
          f'resumed from step {self._steps_done()} (optimiser step '
          f'{int(np.max(self.state.step))}) in {self.workdir}', file=sys.stderr)

  def _save(self, step):
    states = [it.get_state() for it in self.train_iters]
    data = {'data_states': states} if self.pop.batched else {'data_state': states[0]}
    self.ckpt.save(step, state=self.state, run_state=self.run_state,
                   extra=dict(data, config=json.loads(self.c.to_json_best_effort())))
    if self.weighter:  # the gather is every process's; the files process 0's
      states = self.pop.unstack(sharding_lib.to_host(self.run_state.weighter))
      for path, state in zip(self.member_dirs, states) if self.primary else ():
        self.weighter.write(state, path, self.tokenizer)

  def _steps_done(self):
    return int(np.max(self.run_state.count('rl_steps')))

  def run(self):
    """The loop: evaluate step 0, then step / evaluate / log / checkpoint up to num_steps. On
    SIGINT or SIGTERM the step in flight finishes, a checkpoint is written and the loop ends;
    returns each member's last metrics record and the signal that stopped it (or None)."""
    c, start = self.c, self._steps_done()
    if start >= c.num_steps or self._budget_spent():
      print(
          f'already finished: {self.workdir} holds {start} steps (num_steps {c.num_steps}, '
          f'token budget {c.token_budget or "none"}; raise them to continue it)', file=sys.stderr)
      self.close()
      return [metric_writer.last_record(d) for d in self.member_dirs], None
    # Weights & Biases (config.log.wandb_project): one run per metric stream, process 0's.
    trackers = tracking.start_runs(c.log, self.member_dirs if self.primary else [],
                                   revision=distributed.code_revision, workdir=self.workdir)
    writers = [
        metric_writer.MetricWriter(d, resume_step=start + 1 if start else 0, files=self.primary,
                                   tracker=t)
        for d, t in itertools.zip_longest(self.member_dirs, trackers)
    ]
    progress = loop.Progress(c.num_steps, start, every=c.log.progress_every, show=self.primary)
    eval_every = c.eval.every if self.eval_examples else 0
    if not self.eval_examples and c.eval.every:
      print('no held-out problems (no test split): evaluation is skipped', file=sys.stderr)
    last = [{}] * self.pop.n
    with loop.StopOnSignal() as stop, metric_writer.closing(writers):
      if start == 0 and eval_every:
        evals = self.evaluate(0)
        progress.evaluation(0, evals)
        for writer, metrics in zip(writers, evals):
          writer.write(0, metrics)
      for step in range(start + 1, c.num_steps + 1):
        metrics = self.step(step)
        final = step == c.num_steps or self._budget_spent()
        if eval_every and (step % eval_every == 0 or final):
          evals = self.evaluate(step)
          progress.evaluation(step, evals)
          for m, e in zip(metrics, evals):
            m.update(e)
        last = [w.write(step, m) for w, m in zip(writers, metrics)]
        if jax.process_count() > 1 and distributed.any_process(stop.signal is not None):
          stop.signal = stop.signal or 'SIGTERM (of another process)'
        if step % c.log.ckpt_every == 0 or final or stop.signal:
          self._save(step)
        progress.update(step, metrics)
        if final and step < c.num_steps:
          print(f'token budget {c.token_budget} reached at step {step}', file=sys.stderr)
          break
        if stop.signal:
          print(
              f'{stop.signal} at step {step}: checkpoint written; run the same command to '
              'resume', file=sys.stderr)
          break
    progress.close()
    self.close()
    return last, stop.signal

  def _budget_spent(self):
    budget = self.c.token_budget  # a single run's (config_check: no budget for a population)
    return bool(budget) and self.run_state.count('generated_tokens') >= budget

  def close(self):
    """Releases the verifier's processes, the checkpointer and the workdir lock (another trainer
    may then use it)."""
    self.gen.close()
    self.ckpt.close()
    if self._lock is not None:
      self._lock.close()
