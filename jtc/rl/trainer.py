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
from jtc.models import moe_dispatch
from jtc.rl import batch as batch_lib
from jtc.rl import checkpoints
from jtc.rl import config_check
from jtc.rl import distributed
from jtc.rl import evaluation
from jtc.rl import ledger_recorder
from jtc.rl import partial as partial_lib
from jtc.rl import progress as progress_lib
from jtc.rl import population as population_lib
from jtc.rl import preflight
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import step as step_lib
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
      if getattr(self, '_mesh_set', None) is not None:
        self._mesh_set.__exit__(None, None, None)
      raise

  def _build(self, schedule_steps, policy):
    config, population = self.c, self.pop
    self.model_config, params, self.tokenizer = policy or checkpoints.load_policy(config.policy)
    config_check.validate_policy(config, self.model_config, population.n)  # LoRA, MoE vs model
    self.G, self.P = config.rollout.sampling.num_samples, config.data.prompt_width
    self.task = None if config.data.dataset else tasks_lib.get_task(config.data.task)
    self.updates_per_step = update_lib.updates_per_step(config.optim,
                                                        config.rollout.prompts_per_step)
    self.schedules = [  # each member's learning rate, logged
        update_lib.learning_rate_schedule(config.optim, schedule_steps * self.updates_per_step,
                                          population.value(m, 'optim.learning_rate', None))
        for m in population.members
    ]
    self.hparams = population.varied()  # the varied keys' per-member values, traced in the step
    self.mesh = sharding_lib.make_mesh(**sharding_lib.mesh_sizes(**config.mesh))
    print(
        f'mesh {dict(self.mesh.shape)}: {jax.device_count()} devices, {jax.process_count()} '
        f'processes' + (f', {population.n} population members' if population.batched else ''),
        file=sys.stderr)
    # A mixture of experts' all-to-all dispatch runs over this mesh: set until `close`.
    self._mesh_set = moe_dispatch.mesh_context(self.mesh, self.model_config)
    # The state's structure and shardings, the LoRA base, the KL reference, the lag and the
    # jitted stages: decided once, in `jtc.rl.step.build` (the planner compiles the same).
    self.rl_step = step_lib.build(config, self.mesh, self.model_config, params=params,
                                  schedule_steps=schedule_steps,
                                  ids=(self.tokenizer.eos_id, self.tokenizer.pad_id))
    self.state, self.frozen, self.ref_params = self.rl_step.materialise(params)
    self.gen = rollout_lib.Generator.from_config(config, self.rl_step.sampler_config,
                                                 self.tokenizer, self.task,
                                                 to_device=self._to_device, population=population,
                                                 mesh=self.mesh)
    self.pools = partial_lib.init_pools(config, self.rl_step.sampler_config, population.n,
                                        self.tokenizer.pad_id)  # partial rollouts' rows in flight
    # Held-out evaluation samples from the policy as trained, whatever the rollouts' sampler.
    self.eval_gen = dataclasses.replace(self.gen, model_config=self.rl_step.infer_config,
                                        return_routing=False)
    self.run_state = self._initial_run_state()
    self.train_iters, self.eval_examples, prompts, notes = data_lib.run_data(
        config.data, batch_size=config.rollout.prompts_per_step,
        seeds=[m.seed for m in population.members], eval_problems=config.eval.problems,
        tokenizer=self.tokenizer)
    self.gen.check_prompt_width(prompts)
    for line in notes + traps.for_run(config.data, self.gen.reward_fn) if self.primary else ():
      print(line, file=sys.stderr)  # data.overlong's counts; the traps of jtc.data.traps
    self.ckpt = checkpoints.TrainCheckpointer(os.path.join(self.workdir, 'checkpoints'),
                                              max_to_keep=config.log.keep_checkpoints)
    self._restore()
    self.member_dirs = population_lib.record(self.workdir, config, schedule_steps, population,
                                             write=self.primary)
    self._build_instruments(self.rl_step.infer_config)
    # Every stage fits, before any rollout (compiled by the functions the steps then call).
    preflight.check(self.rl_step)

  def _initial_run_state(self):
    """Each member's counters, token counts and plug-in state (stacked), placed replicated over
    the mesh (so that a restored run state lands where the step's arrays are), and a policy
    lag's slots, every one the initial policy."""
    weighter = self.rl_step.weighter
    run_state = self.pop.stack([
        update_lib.RunState.init(self.model_config.vocab_size,
                                 weighter.init_state() if weighter else None)
        for _ in self.pop.members
    ])
    replicated = sharding_lib.replicated(self.mesh)
    run_state = jax.tree.map(
        lambda x: x
        if isinstance(x, np.ndarray) else sharding_lib.to_device(np.asarray(x), replicated),
        run_state)
    if self.rl_step.lag:
      run_state = run_state.replace(lagged_params=tuple(
          self.rl_step.copy_params(self.state.params) for _ in range(self.rl_step.lag)))
    return run_state

  @property
  def state_sh(self):
    return self.rl_step.state_sh

  def _policy(self, params):
    """The policy of trained ``params``: themselves, or a LoRA run's adapters on its base."""
    return params if self.frozen is None else self.frozen.replace(adapters=params)

  def _to_device(self, x):
    sharding = sharding_lib.batch_sharding(self.mesh, np.shape(x), members=self.pop.batched)
    return sharding_lib.to_device(x, sharding)

  def _build_instruments(self, infer_config):
    """The jitted diagnostics, LoRA merge and ledger columns (instruments, not stages)."""
    config, population = self.c, self.pop

    def diagnose(params, batch, hparams, token_counts):
      return diagnostics.step_diagnostics(
          params, infer_config, batch, loss_name=config.loss.name,
          loss_hparams=population_lib.loss_hparams(config.loss.hparams.to_dict(),
                                                   hparams), group_size=self.G,
          completion_start=self.P, token_counts=token_counts, mode=config.log.diagnostics_mode)

    self._diagnostics = jax.jit(population.map(diagnose))
    self._merged = jax.jit(population.map(lambda policy: policy.merged()))  # LoRA ledger params
    self._ledger_columns = ledger_recorder.make_columns_fn(config, infer_config, population)

  def step(self, step):
    """Rollout -> batch -> updates for RL step ``step``; returns each member's metrics."""
    config, population = self.c, self.pop
    keys = [
        jax.random.split(jax.random.fold_in(jax.random.key(m.seed), step), 3)
        for m in population.members
    ]
    k_rollout, k_order, k_weights = (population.stack([k[i] for k in keys]) for i in range(3))
    # Under a policy lag of k steps the rollouts come from the parameters of step - k (the
    # initial ones for the first k steps), as an asynchronous trainer's would.
    lagged = self.run_state.lagged_params
    behaviour_params = lagged[0] if lagged else self.state.params
    t0 = time.perf_counter()
    collect = rollout_lib.collect if self.pools is None else functools.partial(  # partial rollouts
        partial_lib.collect, pools=self.pools, version=max(step - 1 - len(lagged), 0), c=config)
    rollouts, rounds = collect(self.gen, self._policy(behaviour_params),
                               [functools.partial(next, it) for it in self.train_iters], k_rollout,
                               sampling=config.rollout.sampling.to_dict(),
                               dynamic_sampling=config.dapo.dynamic_sampling,
                               max_rounds=config.dapo.dynamic_sampling_rounds,
                               temperature=self.hparams.get('rollout.sampling.temperature'))
    self.rollouts = rollouts  # the step's rollouts, one per member (for inspection)
    t1 = time.perf_counter()
    batch, metrics, self.run_state = batch_lib.make_batch(
        config, rollouts, self._policy(behaviour_params), self.run_state, task=self.task,
        behaviour_fn=self.rl_step.behaviour, ref_params=self.ref_params, to_device=self._to_device,
        weights_fn=self.rl_step.delta, rng=k_weights, population=population,
        proximal_params=self._policy(self.state.params) if lagged else None)
    if lagged:  # this step's parameters join the lag, the oldest leave it
      self.run_state = self.run_state.replace(lagged_params=lagged[1:] +
                                              (self.rl_step.copy_params(self.state.params),))
    jax.block_until_ready(batch.old_logps_BT)
    t2 = time.perf_counter()
    diagnose = config.log.diagnostics_every and step % config.log.diagnostics_every == 0
    recorder = None
    if config.log.ledger_every and step % config.log.ledger_every == 0:
      recorder = ledger_recorder.LedgerRecorder(self._ledger_columns, batch, population)
    update_fn = self.rl_step.update if self.frozen is None else (
        lambda state, mb, hparams: self.rl_step.update(state, mb, hparams, self.frozen))
    counts_V = self.run_state.token_counts_V
    self.state, update_metrics = update_lib.run_updates(
        self.state, batch, k_order, self.hparams, update_fn=update_fn,
        minibatch_fn=self.rl_step.minibatch, num_groups=config.rollout.prompts_per_step,
        minibatch_prompts=config.optim.minibatch_prompts, ppo_epochs=config.optim.ppo_epochs,
        group_size=self.G, minibatch_order=config.optim.minibatch_order,
        population=population, diagnose_fn=(lambda params, mb, hparams: self._diagnostics(
            self._policy(params), mb, hparams, token_counts=counts_V)) if diagnose else None,
        before_update=self._ledger_hook(recorder))
    t3 = time.perf_counter()
    n_tokens = [int(r.completion_mask_BT.sum()) for r in rollouts]
    self.run_state = self.run_state.add(
        rl_steps=1, generated_tokens=population.stack([np.int64(n) for n in n_tokens]),
        rollouts=rollouts[0].rewards_B.shape[0], update_steps=self.updates_per_step,
        prompts=population.stack(
            [np.int64(config.rollout.prompts_per_step * (1 + r)) for r in rounds]))
    counts = {
        k: population.unstack(np.asarray(self.run_state.count(k))) for k in update_lib.COUNTERS
    }
    rates = [float(self.schedules[m](counts['update_steps'][m] - 1)) for m in range(population.n)]
    if recorder:  # every process takes part (gathers); process 0 writes
      recorder.write(step, run_dirs=self.member_dirs, rollouts=rollouts, tokenizer=self.tokenizer,
                     c=config, model_config=self.model_config, learning_rates=rates,
                     files=self.primary)
    failures = verifiers.take_metrics(self.gen.reward_fn)  # a user's reward function's
    for m in range(population.n):
      metrics[m].update(update_metrics[m], **failures,
                        **partial_lib.metrics(self.pools, m, rollouts[m], step))
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
    config, population = self.c, self.pop
    t0 = time.perf_counter()
    keys = population.keys(lambda m: jax.random.fold_in(jax.random.key(m.seed + 1), step))
    outs = evaluation.evaluate(self.eval_gen, self._policy(self.state.params), self.eval_examples,
                               keys, sampling=config.eval.sampling.to_dict(),
                               batch_prompts=config.eval.batch_prompts, task=self.task)
    if self.task is not None and config.eval.probe_problems:  # exact drift between equivalent forms
      replicated = sharding_lib.replicated(self.mesh)
      for m, out in enumerate(outs):
        params = self._policy(population.member(self.state.params, m, replicated))
        out.update({
            f'probe/{k}': v for k, v in probes.format_probe(
                params, self.eval_gen.model_config, self.tokenizer, self.
                eval_examples[:config.eval.probe_problems], self.task.formats, prompt_width=self.P,
                scaffold=self.task.scaffold, chat_template=config.data.chat_template,
                prompt_suffix=config.data.prompt_suffix).items()
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
      self.pools = partial_lib.restore_pools(self.pools, extra)  # the rows in flight, exactly
      print(
          f'resumed from step {self._steps_done()} (optimiser step '
          f'{int(np.max(self.state.step))}) in {self.workdir}', file=sys.stderr)

  def _save(self, step):
    states = [it.get_state() for it in self.train_iters]
    data = {'data_states': states} if self.pop.batched else {'data_state': states[0]}
    data.update(partial_lib.pools_state(self.pools))
    self.ckpt.save(step, state=self.state, run_state=self.run_state,
                   extra=dict(data, config=json.loads(self.c.to_json_best_effort())))
    weighter = self.rl_step.weighter
    if weighter:  # the gather is every process's; the files process 0's
      states = self.pop.unstack(sharding_lib.to_host(self.run_state.weighter))
      for path, state in zip(self.member_dirs, states) if self.primary else ():
        weighter.write(state, path, self.tokenizer)

  def _steps_done(self):
    return int(np.max(self.run_state.count('rl_steps')))

  def run(self):
    """The loop: evaluate step 0, then step / evaluate / log / checkpoint up to num_steps. On
    SIGINT or SIGTERM the step in flight finishes, a checkpoint is written and the loop ends;
    returns each member's last metrics record and the signal that stopped it (or None)."""
    config, start = self.c, self._steps_done()
    if start >= config.num_steps or self._budget_spent():
      print(
          f'already finished: {self.workdir} holds {start} steps (num_steps {config.num_steps}, '
          f'token budget {config.token_budget or "none"}; raise them to continue it)',
          file=sys.stderr)
      self.close()
      return [metric_writer.last_record(d) for d in self.member_dirs], None
    # Weights & Biases (config.log.wandb_project): one run per metric stream, process 0's.
    trackers = tracking.start_runs(config.log, self.member_dirs if self.primary else [],
                                   revision=distributed.code_revision, workdir=self.workdir)
    writers = [
        metric_writer.MetricWriter(d, resume_step=start + 1 if start else 0, files=self.primary,
                                   tracker=t, log=config.log, group_size=self.G)
        for d, t in itertools.zip_longest(self.member_dirs, trackers)
    ]
    progress = progress_lib.Progress(config.num_steps, start, every=config.log.progress_every,
                                     show=self.primary)
    eval_every = config.eval.every if self.eval_examples else 0
    if not self.eval_examples and config.eval.every:
      print('no held-out problems (no test split): evaluation is skipped', file=sys.stderr)
    last = [{}] * self.pop.n
    with progress_lib.StopOnSignal() as stop, metric_writer.closing(writers):
      if start == 0 and eval_every:
        evals = self.evaluate(0)
        progress.evaluation(0, evals)
        for writer, metrics in zip(writers, evals):
          writer.write(0, metrics)
      for step in range(start + 1, config.num_steps + 1):
        metrics = self.step(step)
        final = step == config.num_steps or self._budget_spent()
        if eval_every and (step % eval_every == 0 or final):
          evals = self.evaluate(step)
          progress.evaluation(step, evals)
          for m, e in zip(metrics, evals):
            m.update(e)
        last = [w.write(step, m, rollout=r) for w, m, r in zip(writers, metrics, self.rollouts)]
        if jax.process_count() > 1 and distributed.any_process(stop.signal is not None):
          stop.signal = stop.signal or 'SIGTERM (of another process)'
        if step % config.log.ckpt_every == 0 or final or stop.signal:
          self._save(step)
        progress.update(step, metrics)
        if final and step < config.num_steps:
          print(f'token budget {config.token_budget} reached at step {step}', file=sys.stderr)
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
    self._mesh_set.__exit__(None, None, None)
