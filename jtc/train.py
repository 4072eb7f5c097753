r"""The RL trainer: config-driven runs of every intra-group objective.

  python -m jtc.train --config configs/<method>.py[:arg] --workdir W [--config.key=value]

One RL step:
  prompts (grain) -> G completions per prompt with the KV-cache sampler -> rewards
  -> advantages -> behaviour log-probs (and, for DelTA, hidden states from the same pass)
  -> ppo_epochs x mini-batches of jitted, buffer-donating update steps -> metrics.

A workdir that holds a checkpoint resumes from it (params, optimiser state, step, PRNG key,
data-iterator state and compute counters), and `metrics.jsonl` is trimmed to the restored step,
so a killed run that resumes logs the same metrics as one that was never interrupted.

Dimension key: B rollout sequences (= prompts_per_step * G), G group size, P prompt width,
T max new tokens, L = P + T, D model width.
"""

import dataclasses
import functools
import json
import os
import sys
import time

from absl import app
from absl import flags
import flax
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
import optax

from jtc import advantages as advantages_lib
from jtc import checkpoints
from jtc import data as data_lib
from jtc import delta as delta_lib
from jtc import metric_writer
from jtc import model as model_lib
from jtc import objectives
from jtc import sampler as sampler_lib
from jtc import tasks as tasks_lib

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and metrics go.')
_KILL_AFTER = flags.DEFINE_integer(
    'kill_after_step', -1, 'Testing aid: SIGKILL this process right after the checkpoint of '
    'this step is written (-1 = never).')


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState


# ---------------------------------------------------------------------------------------------
# Configuration checks: every bad setting fails here, before any compute.
# ---------------------------------------------------------------------------------------------

def _choice(key, value, valid):
  if value not in valid:
    raise ValueError(f'config.{key}={value!r} is not valid; valid: {sorted(valid)}')


def validate_config(c):
  """Raises ValueError naming the offending key for any invalid setting."""
  _choice('loss.name', c.loss.name, objectives.LOSSES)
  _choice('advantage', c.advantage, advantages_lib.ADVANTAGES)
  _choice('task', c.task, tasks_lib.TASKS)
  _choice('behaviour_logps', c.behaviour_logps, ('recompute', 'sampler'))
  _choice('delta.ablation', c.delta.ablation, delta_lib.DELTA_ABLATIONS)
  valid_hparams = objectives.default_hparams(c.loss.name)
  unknown = set(c.loss.hparams.keys()) - set(valid_hparams)
  if unknown:
    raise ValueError(f'config.loss.hparams has unknown key(s) {sorted(unknown)} for loss '
                     f'{c.loss.name!r}; valid: {sorted(valid_hparams)}')
  positive = ('num_steps', 'prompts_per_step', 'minibatch_prompts', 'max_new_tokens',
              'prompt_width', 'ppo_epochs', 'eval_k', 'eval_problems', 'ckpt_every',
              'log_every', 'learning_rate', 'temperature', 'eval_temperature')
  for key in positive:
    if not c[key] > 0:
      raise ValueError(f'config.{key}={c[key]!r} must be > 0')
  if c.group_size < 2:
    raise ValueError(f'config.group_size={c.group_size} must be >= 2: intra-group objectives '
                     'compare at least two completions of a prompt')
  if c.prompts_per_step % c.minibatch_prompts:
    raise ValueError(f'config.prompts_per_step={c.prompts_per_step} is not divisible by '
                     f'config.minibatch_prompts={c.minibatch_prompts}')
  for key in ('eps', 'eps_low', 'eps_high'):
    if key in c.loss.hparams and c.loss.hparams[key] is not None and c.loss.hparams[key] <= 0:
      raise ValueError(f'config.loss.hparams.{key}={c.loss.hparams[key]!r} must be > 0')
  if c.delta.lam_min > c.delta.lam_max:
    raise ValueError(f'config.delta.lam_min={c.delta.lam_min} > config.delta.lam_max='
                     f'{c.delta.lam_max}')
  if not 0 <= c.warmup_frac < 1:
    raise ValueError(f'config.warmup_frac={c.warmup_frac} must be in [0, 1)')
  if not 0 <= c.min_lr_ratio <= 1:
    raise ValueError(f'config.min_lr_ratio={c.min_lr_ratio} must be in [0, 1]')
  if c.overlong_buffer >= c.max_new_tokens:
    raise ValueError(f'config.overlong_buffer={c.overlong_buffer} must be < '
                     f'config.max_new_tokens={c.max_new_tokens}')
  n_dev = jax.device_count() if c.mesh_data == -1 else c.mesh_data
  if (c.minibatch_prompts * c.group_size) % n_dev:
    raise ValueError(f'a mini-batch of {c.minibatch_prompts * c.group_size} sequences '
                     f'(config.minibatch_prompts * config.group_size) does not split over '
                     f'{n_dev} devices (config.mesh_data)')


# ---------------------------------------------------------------------------------------------
# Optimiser.
# ---------------------------------------------------------------------------------------------

def learning_rate_schedule(c):
  """Linear warm-up over `warmup_frac` of the updates, then cosine to `min_lr_ratio` x peak."""
  total = c.num_steps * c.ppo_epochs * (c.prompts_per_step // c.minibatch_prompts)
  warmup = int(round(c.warmup_frac * total))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else c.learning_rate, peak_value=c.learning_rate,
      warmup_steps=warmup, decay_steps=max(total, warmup + 1),
      end_value=c.learning_rate * c.min_lr_ratio)


def make_optimizer(c):
  return optax.chain(
      optax.clip_by_global_norm(c.grad_clip) if c.grad_clip > 0 else optax.identity(),
      optax.adamw(learning_rate_schedule(c), b1=c.adam_b1, b2=c.adam_b2,
                  weight_decay=c.weight_decay))


# ---------------------------------------------------------------------------------------------
# Jitted pieces.
# ---------------------------------------------------------------------------------------------

def update_step(state, batch, *, model_config, optimizer, loss_name, loss_hparams,
                completion_start, group_size, ref_params=None):
  """One optimiser step on a mini-batch of whole groups; returns (state, metrics)."""

  def loss_fn(params):
    out = model_lib.sequence_logprobs(params, model_config, batch['tokens'],
                                      batch['input_mask'], completion_start=completion_start)
    loss, metrics = objectives.compute_loss(
        loss_name, logps=out['logps'], old_logps=batch['old_logps'],
        advantages=batch['advantages'], mask=batch['mask'], group_size=group_size,
        ref_logps=batch.get('ref_logps'), token_weights=batch.get('token_weights'),
        entropy=out['entropy'], **loss_hparams)
    mask = batch['mask']
    metrics['entropy'] = jnp.sum(out['entropy'] * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, metrics

  del ref_params
  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics.update(loss=loss, grad_norm=optax.global_norm(grads),
                 update_norm=optax.global_norm(updates), param_norm=optax.global_norm(params))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def behaviour_pass(params, tokens_BL, input_mask_BL, *, model_config, completion_start,
                   return_hidden):
  """Log-probs (and hidden states, for DelTA) of the rollouts under the behaviour policy."""
  return model_lib.sequence_logprobs(params, model_config, tokens_BL, input_mask_BL,
                                     completion_start=completion_start,
                                     return_hidden=return_hidden)


# ---------------------------------------------------------------------------------------------
# Rollouts and scoring (host side).
# ---------------------------------------------------------------------------------------------

def overlong_shaping(lengths_B, *, max_new_tokens, buffer, penalty):
  """DAPO soft overlong punishment: a linear penalty over the last `buffer` tokens."""
  if buffer <= 0:
    return np.zeros_like(lengths_B, dtype=np.float32)
  start = max_new_tokens - buffer
  over = np.clip(lengths_B - start, 0, buffer).astype(np.float32)
  return -penalty * over / buffer


class Trainer:
  """Holds what a run needs; `run()` is the loop."""

  def __init__(self, config, workdir):
    validate_config(config)
    self.c = c = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    bundle = checkpoints.load_policy_bundle(c.init_policy)
    self.model_config = dataclasses.replace(bundle.model_config, **dict(c.model_overrides))
    self.tokenizer = bundle.tokenizer
    self.task = tasks_lib.get_task(c.task)
    self.optimizer = make_optimizer(c)
    self.G = c.group_size
    self.P = c.prompt_width
    self.T = c.max_new_tokens
    self.loss_hparams = c.loss.hparams.to_dict()
    self.ref_params = bundle.params if self.loss_hparams.get('kl_coef') else None
    self.state = TrainState(step=jnp.array(0, jnp.int32), params=bundle.params,
                            opt_state=self.optimizer.init(bundle.params))
    data_dir = c.data_dir or None  # None: jtc's shared cache ($JTC_DATA_DIR or ~/.cache/jtc)
    self.train_iter = data_lib.make_prompt_iterator(
        c.task, split='train', batch_size=c.prompts_per_step, seed=c.seed, data_dir=data_dir)
    self.eval_examples = data_lib.load_examples(c.task, split='test', data_dir=data_dir,
                                                limit=c.eval_problems)
    self.counters = dict(rl_steps=0, generated_tokens=0, rollouts=0, update_steps=0, prompts=0)
    self.ckpt = checkpoints.TrainCheckpointer(os.path.join(workdir, 'checkpoints'),
                                              max_to_keep=c.keep_checkpoints)
    self._restore()
    self._build_jits()

  # -- checkpoints -----------------------------------------------------------------------------

  def _restore(self):
    state, extra = self.ckpt.restore_latest(self.state)
    if state is None:
      return
    self.state = state
    self.counters = extra['counters']
    self.train_iter.set_state(extra['data_state'])
    print(f'resumed from step {int(state.step)} in {self.workdir}', file=sys.stderr)

  def _save(self, step):
    self.ckpt.save(step, state=self.state, extra=dict(
        counters=self.counters, data_state=self.train_iter.get_state(),
        config=json.loads(self.c.to_json_best_effort())))

  # -- compiled functions ----------------------------------------------------------------------

  def _build_jits(self):
    c = self.c
    sample_kw = dict(max_new_tokens=self.T, eos_id=self.tokenizer.eos_id,
                     pad_id=self.tokenizer.pad_id)
    self._sample = functools.partial(  # `sample` is jitted inside
        sampler_lib.sample, config=self.model_config, num_samples=self.G,
        temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, min_p=c.min_p, **sample_kw)
    self._sample_eval = functools.partial(
        sampler_lib.sample, config=self.model_config, num_samples=c.eval_k,
        temperature=c.eval_temperature, top_k=c.eval_top_k, top_p=c.eval_top_p,
        min_p=c.eval_min_p, **sample_kw)
    self._behaviour = jax.jit(functools.partial(
        behaviour_pass, model_config=self.model_config, completion_start=self.P,
        return_hidden=c.loss.name == 'delta'))
    self._update = jax.jit(functools.partial(
        update_step, model_config=self.model_config, optimizer=self.optimizer,
        loss_name=c.loss.name, loss_hparams=self.loss_hparams, completion_start=self.P,
        group_size=self.G), donate_argnums=(0,))
    if c.loss.name == 'delta':
      options = dict(delta_lib.DELTA_ABLATIONS[c.delta.ablation])
      options.setdefault('lam_min', c.delta.lam_min)
      options.setdefault('lam_max', c.delta.lam_max)
      options.setdefault('num_refine', c.delta.num_refine)
      options.setdefault('scope', c.delta.scope)
      self._delta = jax.jit(functools.partial(delta_lib.token_coefficients,
                                              group_size=self.G, **options))

  # -- one RL step -----------------------------------------------------------------------------

  def _rollout(self, examples, key):
    """Samples G completions per prompt and scores them (host-side rewards).

    `examples` is a batch from the prompt iterator: {'prompt': [str], 'answer': [str], ...}.
    """
    prompts, answers = examples['prompt'], examples['answer']
    tokens_BP, mask_BP = data_lib.encode_prompts(self.tokenizer, prompts, width=self.P)
    out = self._sample(self.state.params, prompt_tokens_BP=tokens_BP, prompt_mask_BP=mask_BP,
                       rng=key)
    out = jax.device_get(out)
    completions = [self.tokenizer.decode(row[m > 0].tolist())
                   for row, m in zip(out.completion, out.completion_mask)]
    rep_prompts = [p for p in prompts for _ in range(self.G)]
    rep_answers = [a for a in answers for _ in range(self.G)]
    rewards = np.asarray(self.task.reward_fn(rep_prompts, completions, rep_answers), np.float32)
    return dict(out=out, rewards=rewards, completions=completions)

  def _collect(self, key):
    """A full rollout batch; with dynamic sampling, zero-variance groups are replaced."""
    c = self.c
    examples = next(self.train_iter)
    key, sub = jax.random.split(key)
    ro = self._rollout(examples, sub)
    n_rounds = 0
    if c.dynamic_sampling:
      keep = _informative_groups(ro['rewards'], self.G)
      while not keep.all() and n_rounds < c.dynamic_sampling_rounds:
        n_rounds += 1
        key, sub = jax.random.split(key)
        extra = self._rollout(next(self.train_iter), sub)
        ro = _refill(ro, extra, keep, self.G)
        keep = _informative_groups(ro['rewards'], self.G)
    return ro, n_rounds

  def step(self, step):
    c = self.c
    self.counters['rl_steps'] = step
    key = jax.random.fold_in(jax.random.key(c.seed), step)
    k_roll, k_perm, k_delta = jax.random.split(key, 3)
    t0 = time.perf_counter()
    ro, n_rounds = self._collect(k_roll)
    out = ro['out']
    t1 = time.perf_counter()

    lengths_B = out.completion_mask.sum(-1)
    rewards_B = ro['rewards'] + overlong_shaping(
        lengths_B, max_new_tokens=self.T, buffer=c.overlong_buffer, penalty=c.overlong_penalty)
    adv_B, adv_metrics = advantages_lib.compute_advantages(
        c.advantage, jnp.asarray(rewards_B), group_size=self.G, eps=c.adv_eps,
        std_ddof=c.adv_std_ddof, batch_normalize=c.adv_batch_normalize)
    mask_BT = out.completion_mask.astype(np.float32)
    if c.mask_truncated:
      mask_BT = mask_BT * (~out.truncated)[:, None]
    batch = dict(tokens=out.tokens, input_mask=out.input_mask, mask=mask_BT, advantages=adv_B)
    beh = self._behaviour(self.state.params, out.tokens, out.input_mask)
    batch['old_logps'] = (beh['logps'] if c.behaviour_logps == 'recompute'
                          else jnp.asarray(out.logps))
    if self.ref_params is not None:
      batch['ref_logps'] = self._behaviour(self.ref_params, out.tokens, out.input_mask)['logps']
    metrics = {}
    if c.loss.name == 'delta':
      lam_BT, delta_metrics = self._delta(beh['hidden'], jnp.exp(beh['logps']), adv_B,
                                          jnp.asarray(mask_BT), rng=k_delta)
      batch['token_weights'] = lam_BT
      metrics.update({f'delta/{k}': v for k, v in delta_metrics.items()})
    jax.block_until_ready(batch['old_logps'])
    t2 = time.perf_counter()

    n_groups = c.prompts_per_step
    per_mb = c.minibatch_prompts
    update_metrics = []
    for epoch in range(c.ppo_epochs):
      order = np.asarray(jax.random.permutation(jax.random.fold_in(k_perm, epoch), n_groups))
      for s in range(0, n_groups, per_mb):
        groups = order[s:s + per_mb]
        rows = (groups[:, None] * self.G + np.arange(self.G)[None, :]).reshape(-1)
        mb = jax.tree.map(lambda x, rows=rows: jnp.asarray(x)[rows], batch)
        self.state, m = self._update(self.state, mb)
        update_metrics.append(m)
    update_metrics = jax.device_get(update_metrics)
    t3 = time.perf_counter()

    n_tokens = int(out.completion_mask.sum())
    self.counters['generated_tokens'] += n_tokens
    self.counters['rollouts'] += int(out.tokens.shape[0])
    self.counters['prompts'] += n_groups * (1 + n_rounds)
    self.counters['update_steps'] += len(update_metrics)
    for k in update_metrics[0]:
      metrics[k] = float(np.mean([m[k] for m in update_metrics]))
    metrics.update({f'adv/{k}': float(v) for k, v in adv_metrics.items()})
    correct = ro['rewards'] > 0.5
    metrics.update(
        reward_mean=float(rewards_B.mean()), reward_std=float(rewards_B.std()),
        accuracy=float(correct.mean()), response_length=float(lengths_B.mean()),
        frac_truncated=float(out.truncated.mean()), dynamic_sampling_rounds=n_rounds,
        time_sample=t1 - t0, time_score=t2 - t1, time_update=t3 - t2,
        tokens_per_s=n_tokens / max(t3 - t0, 1e-9),
        learning_rate=float(learning_rate_schedule(c)(self.counters['update_steps'])),
        **{f'compute/{k}': v for k, v in self.counters.items()})
    metrics.update(format_metrics(self.task, ro['completions'], correct))
    return metrics

  def evaluate(self, step):
    """avg@k accuracy on the held-out problems at the config's decoding settings."""
    c = self.c
    key = jax.random.fold_in(jax.random.key(c.seed + 1), step)
    correct = []
    completions_all = []
    batch = c.prompts_per_step
    for s in range(0, len(self.eval_examples), batch):
      chunk = self.eval_examples[s:s + batch]
      n_real = len(chunk)
      chunk = chunk + [chunk[-1]] * (batch - n_real)  # one compiled shape
      prompts = [ex['prompt'] for ex in chunk]
      tokens_BP, mask_BP = data_lib.encode_prompts(self.tokenizer, prompts, width=self.P)
      out = jax.device_get(self._sample_eval(
          self.state.params, prompt_tokens_BP=tokens_BP, prompt_mask_BP=mask_BP,
          rng=jax.random.fold_in(key, s)))
      n_keep = n_real * c.eval_k
      completions = [self.tokenizer.decode(row[m > 0].tolist()) for row, m in
                     zip(out.completion[:n_keep], out.completion_mask[:n_keep])]
      rep = [ex for ex in chunk[:n_real] for _ in range(c.eval_k)]
      rewards = self.task.reward_fn([e['prompt'] for e in rep], completions,
                                    [e['answer'] for e in rep])
      correct.append(np.asarray(rewards) > 0.5)
      completions_all += completions
    correct = np.concatenate(correct)
    metrics = {f'eval/avg@{c.eval_k}': float(correct.mean())}
    metrics.update({f'eval/{k}': v for k, v in
                    format_metrics(self.task, completions_all, correct).items()})
    return metrics

  def run(self, *, kill_after_step=-1):
    c = self.c
    start = self.counters['rl_steps']
    writer = metric_writer.MetricWriter(self.workdir, resume_step=start + 1)
    try:
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      bar = tqdm(total=c.num_steps, initial=start, desc='rl', dynamic_ncols=True,
                 file=sys.stderr, disable=None)
    except ImportError:
      bar = None
    last = {}
    if start == 0 and c.eval_every:
      writer.write(0, self.evaluate(0))
    for step in range(start + 1, c.num_steps + 1):
      if c.token_budget and self.counters['generated_tokens'] >= c.token_budget:
        print(f'token budget {c.token_budget} reached at step {step - 1}', file=sys.stderr)
        break
      metrics = self.step(step)
      if c.eval_every and (step % c.eval_every == 0 or step == c.num_steps):
        metrics.update(self.evaluate(step))
      last = writer.write(step, metrics)
      if step % c.ckpt_every == 0 or step == c.num_steps:
        self._save(step)
        if step == kill_after_step:
          os.kill(os.getpid(), 9)
      if bar is not None:
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", acc=f"{metrics['accuracy']:.2f}",
                        ent=f"{metrics.get('entropy', 0):.2f}")
    if bar is not None:
      bar.close()
    writer.close()
    self.ckpt.close()
    return last


def _informative_groups(rewards_B, G):
  """[num_groups] bool: groups whose rewards are not all equal (DAPO dynamic sampling)."""
  r = rewards_B.reshape(-1, G)
  return r.max(-1) > r.min(-1)


def _refill(ro, extra, keep, G):
  """Replaces zero-variance groups of `ro` by informative groups of `extra`, in order."""
  new_keep = _informative_groups(extra['rewards'], G)
  donors = list(np.flatnonzero(new_keep))
  out = ro['out']
  fields = {f.name: np.array(getattr(out, f.name)) for f in dataclasses.fields(out)}
  rewards = ro['rewards'].copy()
  completions = list(ro['completions'])
  for g in np.flatnonzero(~keep):
    if not donors:
      break
    d = donors.pop(0)
    dst, src = slice(g * G, (g + 1) * G), slice(d * G, (d + 1) * G)
    for name in fields:
      fields[name][dst] = np.asarray(getattr(extra['out'], name))[src]
    rewards[dst] = extra['rewards'][src]
    completions[dst] = extra['completions'][src]
  return dict(out=out.replace(**fields), rewards=rewards, completions=completions)


def format_metrics(task, completions, correct_B):
  """Share of each equivalent surface form among correct completions, and its entropy."""
  formats = getattr(task, 'formats', ())
  if not formats:
    return {}
  names = [task.format_of(c) for c, ok in zip(completions, correct_B) if ok]
  if not names:
    return {}
  counts = np.array([names.count(f) for f in formats], np.float64)
  p = counts / max(counts.sum(), 1)
  nz = p[p > 0]
  out = {f'format/{f}': float(v) for f, v in zip(formats, p)}
  out['format/entropy'] = float(-(nz * np.log(nz)).sum())
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if _WORKDIR.value is None:
    raise app.UsageError('--workdir is required')
  trainer = Trainer(_CONFIG.value, _WORKDIR.value)
  last = trainer.run(kill_after_step=_KILL_AFTER.value)
  print(json.dumps({k: v for k, v in last.items() if 'eval' in k or k in (
      'step', 'reward_mean', 'accuracy')}))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main)
