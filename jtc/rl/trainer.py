r"""The RL trainer: config-driven runs of every intra-group objective.

  python -m jtc.train --config configs/<method>.py[:smoke|runlocal] --workdir W [--config.key=value]

Methods: one config file each in configs/; every key is documented in configs/common.py.

One RL step (`Trainer.step`), each stage handing the next a typed value:
  prompts -> `rollout.collect` (G samples per prompt, rewards, DAPO refill)     -> Rollout
  -> advantages -> behaviour pass (+ token weights, e.g. DelTA)                -> update.Batch
  -> ppo_epochs x mini-batches of `update.update_step` (jitted, donated)       -> metrics.

Real models (configs/real/): `--config.policy.checkpoint=DIR` loads a Hugging Face Llama/Qwen
directory; `--config.data.dataset=FILE.jsonl` reads question/answer records (docs/scaling.md).

A workdir holds one run: checkpoints (train state, run state, data-iterator state, config),
`metrics.jsonl` (one line per step) and TensorBoard events; started again, it resumes exactly.

Dimension key: B rollout sequences (= prompts_per_step * G), G group size, P prompt width,
T max new tokens, L = P + T, V vocabulary.
"""

import dataclasses
import functools
import json
import os
import sys
import time

from absl import flags
import jax
import numpy as np

from jtc.analysis import probes
from jtc.rl import checkpoints
from jtc.rl import config_check
from jtc.rl import cli
from jtc.data import pipeline as data_lib
from jtc.analysis import diagnostics
from jtc.analysis import metric_writer
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.data import tasks as tasks_lib
from jtc.objectives import token_weights
from jtc.rl import update as update_lib
from jtc.rl import workdir as workdir_lib


class Trainer:
  """A run's compiled functions and state; `run()` is the loop. `policy=(model_config, params,
  tokenizer)` replaces the config's policy (tests and benchmarks)."""

  def __init__(self, config, workdir, *, policy=None, allow_config_change=False):
    config_check.validate(config)
    self.c = c = config
    self.workdir = workdir
    self._lock, schedule_steps = workdir_lib.claim(workdir, c, allow_changes=allow_config_change)
    try:
      self._build(schedule_steps, policy)
    except BaseException:
      self._lock.close()  # another trainer (or this one, fixed) may use the workdir at once
      raise

  def _build(self, schedule_steps, policy):
    c, workdir = self.c, self.workdir
    self.model_config, params, self.tokenizer = policy or checkpoints.load_policy(c.policy)
    self.G, self.P = c.rollout.sampling.num_samples, c.data.prompt_width
    self.task = None if c.data.dataset else tasks_lib.get_task(c.data.task)
    self.updates_per_step = update_lib.updates_per_step(c.optim, c.rollout.prompts_per_step)
    total_updates = schedule_steps * self.updates_per_step
    self.schedule = update_lib.learning_rate_schedule(c.optim, total_updates)
    self.optimizer = update_lib.make_optimizer(c.optim, total_updates)
    self.mesh = sharding_lib.make_mesh(**sharding_lib.mesh_sizes(**c.mesh))
    print(
        f'mesh {dict(self.mesh.shape)}: {jax.device_count()} devices, {jax.process_count()} '
        'processes', file=sys.stderr)
    param_sh = sharding_lib.param_shardings(params, self.mesh)
    self.state, self.state_sh = update_lib.init_state(params, self.optimizer,
                                                      param_shardings=param_sh,
                                                      replicated=sharding_lib.replicated(self.mesh))
    self.ref_params = None
    if c.loss.hparams.get('kl_coef'):  # a frozen copy, never aliased with the donated state
      self.ref_params = checkpoints.frozen_copy(
          self.state.params, c.policy.ref_param_dtype or self.model_config.param_dtype, param_sh)
    # Sampling and the behaviour pass never differentiate: no rematerialisation there.
    infer_config = dataclasses.replace(self.model_config, remat=False)
    self.gen = rollout_lib.Generator.from_config(c, infer_config, self.tokenizer, self.task,
                                                 to_device=self._to_device)
    self.weighter = (token_weights.PLUGINS[c.token_weights].from_config(
        c.delta, group_size=self.G, model_config=self.model_config) if c.token_weights else None)
    self.run_state = update_lib.RunState.init(self.model_config.vocab_size,
                                              self.weighter.init_state() if self.weighter else None)
    self.train_iter, self.eval_examples, prompts = data_lib.run_data(
        c.data, batch_size=c.rollout.prompts_per_step, seed=c.seed, eval_problems=c.eval.problems)
    self.gen.check_prompt_width(prompts)
    self.ckpt = checkpoints.TrainCheckpointer(os.path.join(workdir, 'checkpoints'),
                                              max_to_keep=c.log.keep_checkpoints)
    self._restore()
    workdir_lib.record_config(workdir, c, schedule_steps)
    self._build_jits(infer_config)

  def _to_device(self, x):
    return sharding_lib.to_device(x, sharding_lib.batch_sharding(self.mesh, np.shape(x)))

  def _build_jits(self, infer_config):
    c = self.c
    self._behaviour = jax.jit(
        functools.partial(rollout_lib.behaviour_pass, model_config=infer_config,
                          completion_start=self.P, return_hidden=bool(self.weighter and
                                                                      self.weighter.needs_hidden)))
    self._minibatch, self._update = update_lib.jit_minibatch_and_update(
        c, self.model_config, self.optimizer, self.mesh, self.state_sh)
    self._diagnostics = jax.jit(
        functools.partial(  # (params, batch, token_counts)
            diagnostics.step_diagnostics, model_config=infer_config, loss_name=c.loss.name,
            loss_hparams=c.loss.hparams.to_dict(), group_size=self.G, completion_start=self.P,
            mode=c.log.diagnostics_mode))

  def step(self, step):
    """Rollout -> batch -> updates for RL step ``step``; returns its metrics."""
    c = self.c
    k_rollout, k_order, k_weights = jax.random.split(
        jax.random.fold_in(jax.random.key(c.seed), step), 3)
    t0 = time.perf_counter()
    rollout, rounds = rollout_lib.collect(self.gen, self.state.params,
                                          lambda: next(self.train_iter), k_rollout,
                                          sampling=c.rollout.sampling.to_dict(),
                                          dynamic_sampling=c.dapo.dynamic_sampling,
                                          max_rounds=c.dapo.dynamic_sampling_rounds)
    t1 = time.perf_counter()
    batch, metrics, self.run_state = update_lib.make_batch(c, rollout, self.state.params,
                                                           self.run_state, task=self.task,
                                                           behaviour_fn=self._behaviour,
                                                           ref_params=self.ref_params,
                                                           to_device=self._to_device,
                                                           weighter=self.weighter, rng=k_weights)
    jax.block_until_ready(batch.old_logps)
    t2 = time.perf_counter()
    diagnose = c.log.diagnostics_every and step % c.log.diagnostics_every == 0
    self.state, update_metrics = update_lib.run_updates(
        self.state, batch, k_order, update_fn=self._update, minibatch_fn=self._minibatch,
        num_groups=c.rollout.prompts_per_step, minibatch_prompts=c.optim.minibatch_prompts,
        ppo_epochs=c.optim.ppo_epochs, group_size=self.G, diagnose_fn=functools.partial(
            self._diagnostics, token_counts=self.run_state.token_counts_V) if diagnose else None)
    metrics.update(update_metrics)
    t3 = time.perf_counter()
    n_tokens = int(rollout.completion_mask_BT.sum())
    self.run_state = self.run_state.add(rl_steps=1, generated_tokens=n_tokens,
                                        rollouts=rollout.rewards_B.shape[0],
                                        update_steps=self.updates_per_step,
                                        prompts=c.rollout.prompts_per_step * (1 + rounds))
    metrics.update(dynamic_sampling_rounds=rounds, time_sample=t1 - t0, time_score=t2 - t1,
                   time_update=t3 - t2, tokens_per_s=n_tokens / max(t3 - t0, 1e-9),
                   learning_rate=float(self.schedule(self.run_state.count('update_steps') - 1)),
                   **{f'compute/{k}': self.run_state.count(k) for k in update_lib.COUNTERS})
    return metrics

  def evaluate(self, step):
    """avg@k accuracy on the held-out problems at the config's evaluation decoding."""
    c = self.c
    out = rollout_lib.evaluate(self.gen, self.state.params, self.eval_examples,
                               jax.random.fold_in(jax.random.key(c.seed + 1),
                                                  step), sampling=c.eval.sampling.to_dict(),
                               batch_prompts=c.rollout.chunk_prompts or c.rollout.prompts_per_step,
                               task=self.task)
    if self.task is not None and c.eval.probe_problems:  # exact drift between equivalent forms
      out.update({
          f'probe/{k}': v for k, v in probes.format_probe(
              self.state.params, self.gen.model_config, self.tokenizer,
              self.eval_examples[:c.eval.probe_problems], self.task.formats, prompt_width=self.P,
              scaffold=self.task.scaffold, chat_template=c.data.chat_template,
              prompt_suffix=c.data.prompt_suffix).items()
      })
    return {f'eval/{k}': v for k, v in out.items()}

  def _restore(self):
    restored = self.ckpt.restore_latest(self.state, self.run_state)
    if restored is not None:
      self.state, self.run_state, extra = restored
      self.train_iter.set_state(extra['data_state'])
      print(
          f"resumed from step {self.run_state.count('rl_steps')} (optimiser step "
          f'{int(self.state.step)}) in {self.workdir}', file=sys.stderr)

  def _save(self, step):
    self.ckpt.save(
        step, state=self.state, run_state=self.run_state,
        extra=dict(data_state=self.train_iter.get_state(),
                   config=json.loads(self.c.to_json_best_effort())))
    if self.weighter:
      self.weighter.write(self.run_state.weighter, self.workdir, self.tokenizer)

  def run(self):
    """The loop: evaluate step 0, then step / evaluate / log / checkpoint up to num_steps. On
    SIGINT or SIGTERM the step in flight finishes, a checkpoint is written and the loop ends;
    returns the last metrics record and the signal that stopped it (or None)."""
    c, start = self.c, self.run_state.count('rl_steps')
    if start >= c.num_steps or self._budget_spent():
      print(
          f'already finished: {self.workdir} holds {start} steps (num_steps {c.num_steps}, '
          f'token budget {c.token_budget or "none"}; raise them to continue it)', file=sys.stderr)
      self.close()
      return metric_writer.last_record(self.workdir), None
    writer = metric_writer.MetricWriter(self.workdir, resume_step=start + 1 if start else 0)
    progress = cli.Progress(c.num_steps, start, every=c.log.progress_every)
    eval_every = c.eval.every if self.eval_examples else 0
    if not self.eval_examples and c.eval.every:
      print('no held-out problems (no test split): evaluation is skipped', file=sys.stderr)
    last, step = {}, start
    with cli.StopOnSignal() as stop:
      if start == 0 and eval_every:
        writer.write(0, self.evaluate(0))
      for step in range(start + 1, c.num_steps + 1):
        metrics = self.step(step)
        final = step == c.num_steps or self._budget_spent()
        if eval_every and (step % eval_every == 0 or final):
          metrics.update(self.evaluate(step))
        last = writer.write(step, metrics)
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
    writer.close()
    self.close()
    return last, stop.signal

  def _budget_spent(self):
    budget = self.c.token_budget
    return bool(budget) and self.run_state.count('generated_tokens') >= budget

  def close(self):
    """Releases the checkpointer and the workdir lock (another trainer may then use it)."""
    self.ckpt.close()
    self._lock.close()


def main():
  """`python -m jtc.train` (jtc/train.py)."""
  cli.define_train_flags()
  flags.adopt_module_key_flags(cli)  # --help lists the trainer's flags
  cli.train_main(Trainer)
