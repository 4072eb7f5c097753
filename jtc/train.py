r"""The RL trainer: config-driven runs of every intra-group objective.

  python -m jtc.train --config configs/<method>.py[:arg] --workdir W [--config.key=value]

One RL step:
  prompts (grain) -> G completions per prompt with the KV-cache sampler -> rewards
  -> advantages -> behaviour log-probs (and, for DelTA, hidden states from the same pass)
  -> ppo_epochs x mini-batches of jitted, buffer-donating update steps -> metrics.

Real models (configs/real/): `--config.checkpoint=DIR` loads a Hugging Face Llama/Qwen
directory (weights with `jtc.hf_import`, `tokenizer.json` + chat template + eos/pad ids with
`jtc.tokenizer.HFTokenizer`) instead of a jtc policy bundle; `--config.dataset=FILE.jsonl` reads
question/answer records (`jtc.data`) instead of a synthetic task, scored by `config.reward`
(default `boxed_numeric`: the last `\boxed{}` of the completion must equal the reference).

Memory and scale (config keys, see configs/common.py):
  param_dtype / compute_dtype  master weights + optimiser state (e.g. float32) vs. activations
                               (e.g. bfloat16); log-probs are float32 whatever the compute dtype.
  microbatch_prompts           gradient accumulation: each mini-batch is split into micro-batches
                               of whole groups whose gradients are summed with the weights that
                               make the result equal to the un-split mini-batch (`microbatch_weights`).
  remat                        `jax.checkpoint` around every Transformer block in the update.
  mesh_data/fsdp/tensor        a ('data', 'fsdp', 'tensor') mesh (`jtc.sharding`): parameters and
                               optimiser state sharded by the logical-axis rules (FSDP over
                               'fsdp'), rollout batches over ('data', 'fsdp'); the update step is
                               jitted with explicit in/out shardings.
  ref_param_dtype              the frozen reference policy exists only when loss.hparams.kl_coef
                               > 0; it may be stored in bfloat16.
Multi-host: call `jtc.sharding.initialize_distributed()` first (done by `main`); every process
reads the same global prompt batch and runs the same host logic (see docs/scaling.md).

A workdir that holds a checkpoint resumes from it (params, optimiser state, step, PRNG key,
data-iterator state and compute counters), and `metrics.jsonl` is trimmed to the restored step,
so a killed run that resumes logs the same metrics as one that was never interrupted.

Dimension key: B rollout sequences (= prompts_per_step * G), G group size, P prompt width,
T max new tokens, L = P + T, D model width, n micro-batches per mini-batch.
"""

import dataclasses
import functools
import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import chex
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
from jtc import diagnostics
from jtc import hf_import
from jtc import metric_writer
from jtc import model as model_lib
from jtc import objectives
from jtc import rewards as rewards_lib
from jtc import sampler as sampler_lib
from jtc import sharding as sharding_lib
from jtc import tasks as tasks_lib
from jtc import tokenizer as tokenizer_lib



def define_flags():
  """Command-line flags, defined only when run as a program (so `jtc.sft` can coexist)."""
  config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Where checkpoints and metrics go.')
  flags.DEFINE_integer(
      'kill_after_step', -1, 'Testing aid: SIGKILL this process right after the checkpoint of '
      'this step is written (-1 = never).')
  flags.mark_flags_as_required(['config', 'workdir'])


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


_DTYPE_CHOICES = ('', 'float32', 'bfloat16')  # '' = keep the policy's own


def mesh_sizes(c, n_devices=None):
  """{'data', 'fsdp', 'tensor'} sizes of the config's mesh with a -1 resolved."""
  n = jax.device_count() if n_devices is None else n_devices
  sizes = {'data': c.mesh_data, 'fsdp': c.mesh_fsdp, 'tensor': c.mesh_tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1 or any(v == 0 or v < -1 for v in sizes.values()):
    raise ValueError(f'config.mesh_data/mesh_fsdp/mesh_tensor = {list(sizes.values())} are '
                     'invalid: positive ints, at most one -1 (= the remaining devices)')
  known = int(np.prod([v for v in sizes.values() if v != -1]))
  if free:
    if n % known:
      raise ValueError(f'{n} devices do not split over config.mesh_* = {sizes}')
    sizes[free[0]] = n // known
  if int(np.prod(list(sizes.values()))) != n:
    raise ValueError(f'config.mesh_* = {sizes} does not multiply to the {n} devices')
  return sizes


def num_microbatches(c):
  """n: micro-batches per mini-batch (1 = no gradient accumulation)."""
  return c.minibatch_prompts // (c.microbatch_prompts or c.minibatch_prompts)


def validate_config(c):
  """Raises ValueError naming the offending key for any invalid setting."""
  _choice('loss.name', c.loss.name, objectives.LOSSES)
  _choice('advantage', c.advantage, advantages_lib.ADVANTAGES)
  if not c.checkpoint and not c.init_policy:
    raise ValueError('config.checkpoint is required (a Hugging Face model directory), or '
                     'config.init_policy (a jtc policy bundle)')
  if not c.dataset and not c.task:
    raise ValueError('config.dataset is required (a question/answer JSONL file or a directory '
                     f'of <split>.jsonl files), or config.task (one of {sorted(tasks_lib.TASKS)})')
  if not c.dataset:
    _choice('task', c.task, tasks_lib.TASKS)
  elif not (os.path.isfile(c.dataset) or os.path.isdir(c.dataset)):
    raise ValueError(f'config.dataset={c.dataset!r} is neither a JSONL file nor a directory '
                     'of <split>.jsonl files')
  if c.reward:
    _choice('reward', c.reward, rewards_lib.REWARD_FNS)
  if c.checkpoint and not os.path.isfile(os.path.join(c.checkpoint, 'config.json')):
    raise ValueError(f'config.checkpoint={c.checkpoint!r} is not a Hugging Face model directory '
                     '(no config.json)')
  _choice('behaviour_logps', c.behaviour_logps, ('recompute', 'sampler'))
  _choice('delta.ablation', c.delta.ablation, delta_lib.DELTA_ABLATIONS)
  _choice('diagnostics_mode', c.diagnostics_mode, ('proxy', 'exact'))
  for key in ('param_dtype', 'compute_dtype', 'ref_param_dtype'):
    _choice(key, c[key], _DTYPE_CHOICES)
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
  if c.rollout_chunk_prompts < 0 or (c.rollout_chunk_prompts and
                                     c.prompts_per_step % c.rollout_chunk_prompts):
    raise ValueError(f'config.rollout_chunk_prompts={c.rollout_chunk_prompts} must be 0 (off) '
                     f'or a divisor of config.prompts_per_step={c.prompts_per_step}')
  if c.microbatch_prompts < 0 or (c.microbatch_prompts and
                                  c.minibatch_prompts % c.microbatch_prompts):
    raise ValueError(f'config.microbatch_prompts={c.microbatch_prompts} must be 0 (off) or a '
                     f'divisor of config.minibatch_prompts={c.minibatch_prompts}')
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
  sizes = mesh_sizes(c)
  n_dev = sizes['data'] * sizes['fsdp']
  micro = (c.microbatch_prompts or c.minibatch_prompts) * c.group_size
  if micro % n_dev:
    raise ValueError(f'a (micro-)batch of {micro} sequences (config.microbatch_prompts or '
                     f'config.minibatch_prompts, times config.group_size) does not split over '
                     f'the {n_dev} devices of config.mesh_data x config.mesh_fsdp')


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

def microbatch_weights(mask_nBT, *, aggregation):
  """w_n: how much micro-batch k's loss counts in the loss of the whole mini-batch.

  The mini-batch loss is sum_k w_k loss_k exactly when
    token_mean:  w_k = N_k / N   (N_k real tokens of micro-batch k; DelTA too, since its
                                  coefficients arrive normalised and the loss is a token mean);
    seq_mean_* / seq_mean_token_sum_norm:  w_k = 1 / n   (equal-size micro-batches).
  Sequence-level transforms (GSPO, DFPO) act within a group and groups never straddle
  micro-batches, so they are unaffected.

  Args:
    mask_nBT: [n, B, T] real-token mask of each micro-batch.
    aggregation: the loss's aggregation (`objectives.AGGREGATIONS`).

  Returns:
    w_n float32 [n], summing to 1.
  """
  chex.assert_rank(mask_nBT, 3)
  n = mask_nBT.shape[0]
  if aggregation != 'token_mean':
    return jnp.full((n,), 1.0 / n, jnp.float32)
  z_n = jnp.sum((mask_nBT > 0).astype(jnp.float32), axis=(1, 2))
  total = jnp.sum(z_n)
  return jnp.where(total > 0, z_n / jnp.where(total > 0, total, 1.0), 1.0 / n)


def _combine_metrics(metrics_n, w_n):
  """Per-micro-batch metrics -> mini-batch metrics: max of *_max, min of *_min, else sum w m."""
  out = {}
  for k, v_n in metrics_n.items():
    if k.endswith('_max'):
      out[k] = jnp.max(v_n)
    elif k.endswith('_min'):
      out[k] = jnp.min(v_n)
    else:
      out[k] = jnp.sum(w_n * v_n)
  return out


def update_step(state, batch, *, model_config, optimizer, loss_name, loss_hparams,
                completion_start, group_size):
  """One optimiser step on a mini-batch of whole groups; returns (state, metrics).

  `batch` leaves are [n, B/n, ...]: n micro-batches of whole groups. Their gradients are
  accumulated in float32 with `microbatch_weights` (n = 1: a plain step), so the update equals
  the one on the un-split mini-batch while holding the activations of one micro-batch.
  """

  def loss_fn(params, mb):
    out = model_lib.sequence_logprobs(params, model_config, mb['tokens'],
                                      mb['input_mask'], completion_start=completion_start)
    loss, metrics = objectives.compute_loss(
        loss_name, logps=out['logps'], old_logps=mb['old_logps'],
        advantages=mb['advantages'], mask=mb['mask'], group_size=group_size,
        ref_logps=mb.get('ref_logps'), token_weights=mb.get('token_weights'),
        entropy=out['entropy'], **loss_hparams)
    mask = mb['mask']
    metrics['entropy'] = jnp.sum(out['entropy'] * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, metrics

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  n = batch['tokens'].shape[0]
  if n == 1:
    (loss, metrics), grads = grad_fn(state.params, jax.tree.map(lambda x: x[0], batch))
  else:
    aggregation = loss_hparams.get('aggregation',
                                   objectives.default_hparams(loss_name)['aggregation'])
    w_n = microbatch_weights(batch['mask'], aggregation=aggregation)

    def accumulate(acc, xs):
      mb, w = xs
      (loss, metrics), grads = grad_fn(state.params, mb)
      acc = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), acc, grads)
      return acc, (loss, metrics)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    grads, (loss_n, metrics_n) = jax.lax.scan(accumulate, zeros, (batch, w_n))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    loss = jnp.sum(w_n * loss_n)
    metrics = _combine_metrics(metrics_n, w_n)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics.update(loss=loss, grad_norm=optax.tree.norm(grads),
                 update_norm=optax.tree.norm(updates), param_norm=optax.tree.norm(params))
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


def _put(x, sharding):
  """A host array -> a global jax.Array with `sharding` (multi-host safe: each process fills
  its addressable shards from the same full host value)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _to_host(tree):
  """Global arrays -> numpy on every process (all-gather when the mesh spans hosts)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


def _cast_tree(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      tree)


def load_policy(c):
  """(model_config, params on host, tokenizer) from `config.checkpoint` or `config.init_policy`.

  A Hugging Face directory gives the weights (`hf_import.load_hf_checkpoint`) and
  `tokenizer.json` / `tokenizer_config.json` (chat template, eos and pad tokens).
  `param_dtype`, `compute_dtype`, `remat` and `model_overrides` then adjust the model config;
  the params are cast to its `param_dtype` (the master weights the optimiser updates).
  """
  if c.checkpoint:
    model_config, params = hf_import.load_hf_checkpoint(
        c.checkpoint, param_dtype=c.param_dtype or None, dtype=c.compute_dtype or None,
        as_numpy=True)
    tokenizer = tokenizer_lib.HFTokenizer.from_dir(c.checkpoint)
  else:
    bundle = checkpoints.load_policy_bundle(c.init_policy)
    model_config, params, tokenizer = bundle.model_config, bundle.params, bundle.tokenizer
  overrides = {k: v for k, v in (('param_dtype', c.param_dtype), ('dtype', c.compute_dtype))
               if v}
  if c.remat:
    overrides['remat'] = True
  model_config = dataclasses.replace(model_config, **overrides, **dict(c.model_overrides))
  params = _cast_tree(jax.device_get(params), model_config.jnp_param_dtype)
  for name in ('eos_id', 'pad_id'):
    tid = getattr(tokenizer, name)
    if tid is None or not 0 <= tid < model_config.vocab_size:
      raise ValueError(f'tokenizer {name}={tid!r} is not a token of the model (vocab_size='
                       f'{model_config.vocab_size})')
  return model_config, params, tokenizer


class Trainer:
  """Holds what a run needs; `run()` is the loop.

  `policy=(model_config, params, tokenizer)` replaces the config's checkpoint / init_policy
  (benchmarks and tests that build a model in memory).
  """

  def __init__(self, config, workdir, *, policy=None):
    validate_config(config)
    self.c = c = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    if policy is None:
      policy = load_policy(c)
    self.model_config, params, self.tokenizer = policy
    # Sampling and the behaviour pass never differentiate: no rematerialisation there.
    self.infer_config = dataclasses.replace(self.model_config, remat=False)
    if c.dataset:
      self.task = None
      self.reward_fn = rewards_lib.REWARD_FNS[c.reward or 'boxed_numeric']
    else:
      self.task = tasks_lib.get_task(c.task)
      self.reward_fn = rewards_lib.REWARD_FNS[c.reward] if c.reward else self.task.reward_fn
    self.optimizer = make_optimizer(c)
    self.G = c.group_size
    self.P = c.prompt_width
    self.T = c.max_new_tokens
    self.n_micro = num_microbatches(c)
    self.loss_hparams = c.loss.hparams.to_dict()

    # Mesh, shardings, and the (sharded) train state.
    self.mesh = sharding_lib.make_mesh(**mesh_sizes(c))
    print(f'mesh {dict(self.mesh.shape)} over {jax.device_count()} devices '
          f'({jax.process_count()} processes)', file=sys.stderr)
    self.param_sh = sharding_lib.param_shardings(params, self.mesh)
    self.replicated = sharding_lib.replicated(self.mesh)
    params = jax.tree.map(_put, params, self.param_sh)
    opt_shapes = jax.eval_shape(self.optimizer.init, params)
    opt_sh = optax.tree_map_params(self.optimizer, lambda _, sh: sh, opt_shapes, self.param_sh,
                                   transform_non_params=lambda _: self.replicated)
    self.state_sh = TrainState(step=self.replicated, params=self.param_sh, opt_state=opt_sh)
    opt_state = jax.jit(self.optimizer.init, out_shardings=opt_sh)(params)
    self.ref_params = None
    if self.loss_hparams.get('kl_coef'):
      # A separate frozen copy (never aliased with the donated train state).
      ref_dtype = c.ref_param_dtype or self.model_config.param_dtype
      self.ref_params = jax.jit(functools.partial(_cast_tree, dtype=ref_dtype),
                                out_shardings=self.param_sh)(params)
    self.state = TrainState(step=_put(np.zeros((), np.int32), self.replicated), params=params,
                            opt_state=opt_state)

    data_dir = c.data_dir or None  # None: jtc's shared cache ($JTC_DATA_DIR or ~/.cache/jtc)
    # Every process reads the same global batch (shard 0 of 1): the host-side logic
    # (rewards, advantages) is replicated, the device work is sharded over the mesh.
    source = c.dataset or c.task
    self.train_iter = data_lib.make_prompt_iterator(
        source, split='train', batch_size=c.prompts_per_step, seed=c.seed, data_dir=data_dir,
        shard_index=0, shard_count=1)
    self.eval_examples = self._load_eval_examples(data_dir)
    self.counters = dict(rl_steps=0, generated_tokens=0, rollouts=0, update_steps=0, prompts=0)
    self.token_cloud = delta_lib.init_token_cloud(self.model_config.vocab_size)
    self.token_counts = jnp.zeros((self.model_config.vocab_size,), jnp.float32)
    self.ckpt = checkpoints.TrainCheckpointer(os.path.join(workdir, 'checkpoints'),
                                              max_to_keep=c.keep_checkpoints)
    self._restore()
    self._build_jits()

  def _load_eval_examples(self, data_dir):
    """Held-out problems: the task's test split, `eval_dataset`, or the dataset's test split."""
    c = self.c
    if not c.dataset:
      return data_lib.load_examples(c.task, split='test', data_dir=data_dir,
                                    limit=c.eval_problems)
    if c.eval_dataset:  # a file is its own 'train' split; a directory should have 'test'
      split = 'test' if os.path.isdir(c.eval_dataset) else 'train'
      return data_lib.load_examples(c.eval_dataset, split=split, data_dir=data_dir,
                                    limit=c.eval_problems)
    if os.path.isfile(os.path.join(c.dataset, 'test.jsonl')):
      return data_lib.load_examples(c.dataset, split='test', data_dir=data_dir,
                                    limit=c.eval_problems)
    return []  # no held-out set: evaluation is skipped

  # -- checkpoints -----------------------------------------------------------------------------

  def _restore(self):
    state, extra = self.ckpt.restore_latest(self.state)
    if state is None:
      return
    self.state = state
    self.token_cloud = delta_lib.TokenCloudState(
        lam_sum_V=jnp.asarray(extra['token_cloud']['lam_sum'], jnp.float32),
        count_V=jnp.asarray(extra['token_cloud']['count'], jnp.float32))
    self.token_counts = jnp.asarray(extra['token_counts'], jnp.float32)
    self.counters = extra['counters']
    self.train_iter.set_state(extra['data_state'])
    print(f'resumed from step {int(state.step)} in {self.workdir}', file=sys.stderr)

  def _save(self, step):
    self.ckpt.save(step, state=self.state, extra=dict(
        counters=self.counters, data_state=self.train_iter.get_state(),
        token_cloud=dict(lam_sum=np.asarray(self.token_cloud.lam_sum_V).tolist(),
                         count=np.asarray(self.token_cloud.count_V).tolist()),
        token_counts=np.asarray(self.token_counts).tolist(),
        config=json.loads(self.c.to_json_best_effort())))
    if self.c.loss.name == 'delta':
      self._write_token_cloud()

  def _write_token_cloud(self, k=20):
    """`token_cloud.json`: the tokens with the highest and lowest mean DelTA lambda so far."""
    tb = jax.device_get(delta_lib.top_bottom_tokens(self.token_cloud, k, min_count=5))
    rows = {side: [dict(token=self.tokenizer.decode([int(i)]) or repr(int(i)), id=int(i),
                        mean_lambda=float(m), count=int(n))
                   for i, m, n in zip(tb[f'{side}_ids'], tb[f'{side}_mean'], tb[f'{side}_count'])]
            for side in ('top', 'bottom')}
    with open(os.path.join(self.workdir, 'token_cloud.json'), 'w') as f:
      json.dump(rows, f, indent=1)

  # -- compiled functions ----------------------------------------------------------------------

  def _build_jits(self):
    c = self.c
    sample_kw = dict(max_new_tokens=self.T, eos_id=self.tokenizer.eos_id,
                     pad_id=self.tokenizer.pad_id)
    self._sample = functools.partial(  # `sample` is jitted inside; shardings propagate
        sampler_lib.sample, config=self.infer_config, num_samples=self.G,
        temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, min_p=c.min_p, **sample_kw)
    self._sample_eval = functools.partial(
        sampler_lib.sample, config=self.infer_config, num_samples=c.eval_k,
        temperature=c.eval_temperature, top_k=c.eval_top_k, top_p=c.eval_top_p,
        min_p=c.eval_min_p, **sample_kw)
    self._behaviour = jax.jit(functools.partial(
        behaviour_pass, model_config=self.infer_config, completion_start=self.P,
        return_hidden=c.loss.name == 'delta'))
    # Every leaf of a mini-batch is [n, B/n, ...]: micro-batch rows over ('data', 'fsdp').
    micro_rows = (c.microbatch_prompts or c.minibatch_prompts) * self.G
    self.minibatch_sh = jax.sharding.NamedSharding(
        self.mesh, jax.sharding.PartitionSpec(
            None, *sharding_lib.logical_to_spec(('batch',), (micro_rows,), self.mesh)))
    self._update = jax.jit(functools.partial(
        update_step, model_config=self.model_config, optimizer=self.optimizer,
        loss_name=c.loss.name, loss_hparams=self.loss_hparams, completion_start=self.P,
        group_size=self.G), in_shardings=(self.state_sh, self.minibatch_sh),
        out_shardings=(self.state_sh, self.replicated), donate_argnums=(0,))
    self._diagnostics = jax.jit(functools.partial(
        diagnostics.step_diagnostics, model_config=self.infer_config, loss_name=c.loss.name,
        loss_hparams=self.loss_hparams, group_size=self.G, completion_start=self.P,
        mode=c.diagnostics_mode))
    if c.loss.name == 'delta':
      options = delta_lib.options_for(c.delta.ablation, lam_min=c.delta.lam_min,
                                      lam_max=c.delta.lam_max, num_refine=c.delta.num_refine,
                                      scope=c.delta.scope)
      self._delta = jax.jit(functools.partial(delta_lib.token_coefficients, options=options,
                                              group_size=self.G))
      self._delta_topk = options.proxy == 'topk_hidden'

  # -- one RL step -----------------------------------------------------------------------------

  def _encode(self, prompts):
    """Questions -> left-padded [B, P] prompt tokens/mask (suffix, then the chat template),
    placed on the mesh with the batch sharding."""
    c = self.c
    tokens_BP, mask_BP = data_lib.encode_prompts(
        self.tokenizer, [p + c.prompt_suffix for p in prompts], width=self.P,
        chat_template=c.chat_template)
    sh = sharding_lib.batch_sharding(self.mesh, tokens_BP.shape)
    return _put(tokens_BP, sh), _put(mask_BP, sh)

  def _put_batch(self, x):
    return _put(x, sharding_lib.batch_sharding(self.mesh, np.shape(x)))

  def _score(self, params, out, tokens_BL, input_mask_BL):
    """The behaviour pass over the rollouts (`tokens_BL`, `input_mask_BL`: `out`'s, on device),
    `rollout_chunk_prompts` groups at a time (chunks are put from the host copy in `out`)."""
    rows = self.c.rollout_chunk_prompts * self.G
    if not rows or rows >= out.tokens.shape[0]:
      return self._behaviour(params, tokens_BL, input_mask_BL)
    parts = [self._behaviour(params, self._put_batch(out.tokens[s:s + rows]),
                             self._put_batch(out.input_mask[s:s + rows]))
             for s in range(0, out.tokens.shape[0], rows)]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)

  def _rollout(self, examples, key):
    """Samples G completions per prompt and scores them (host-side rewards).

    `examples` is a batch from the prompt iterator: {'prompt': [str], 'answer': [str], ...}.
    """
    prompts, answers = examples['prompt'], examples['answer']
    chunk = self.c.rollout_chunk_prompts or len(prompts)
    outs = []
    for i, s in enumerate(range(0, len(prompts), chunk)):
      tokens_BP, mask_BP = self._encode(prompts[s:s + chunk])
      # One chunk (the default) keeps the key unchanged.
      sub = key if chunk == len(prompts) else jax.random.fold_in(key, i)
      outs.append(_to_host(self._sample(self.state.params, prompt_tokens_BP=tokens_BP,
                                        prompt_mask_BP=mask_BP, rng=sub)))
    out = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *outs)
    completions = [self.tokenizer.decode(row[m > 0].tolist())
                   for row, m in zip(out.completion, out.completion_mask)]
    rep_prompts = [p for p in prompts for _ in range(self.G)]
    rep_answers = [a for a in answers for _ in range(self.G)]
    rewards = np.asarray(self.reward_fn(rep_prompts, completions, rep_answers), np.float32)
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
    tokens_BL, input_mask_BL = self._put_batch(out.tokens), self._put_batch(out.input_mask)
    batch = dict(tokens=tokens_BL, input_mask=input_mask_BL, mask=self._put_batch(mask_BT),
                 advantages=self._put_batch(np.asarray(adv_B)))
    beh = self._score(self.state.params, out, tokens_BL, input_mask_BL)
    batch['old_logps'] = (beh['logps'] if c.behaviour_logps == 'recompute'
                          else self._put_batch(out.logps))
    if self.ref_params is not None:
      batch['ref_logps'] = self._score(self.ref_params, out, tokens_BL, input_mask_BL)['logps']
    metrics = {}
    if c.loss.name == 'delta':
      batch['token_weights'], delta_metrics = self._delta_weights(beh, out, adv_B, mask_BT,
                                                                  k_delta)
      metrics.update({f'delta/{k}': v for k, v in delta_metrics.items()})
    self.token_counts = diagnostics.update_token_counts(
        self.token_counts, jnp.asarray(out.completion), jnp.asarray(mask_BT))
    jax.block_until_ready(batch['old_logps'])
    t2 = time.perf_counter()

    n_groups = c.prompts_per_step
    per_mb = c.minibatch_prompts
    host_batch = _to_host(batch)
    update_metrics = []
    diags = []
    n_updates = c.ppo_epochs * (n_groups // per_mb)
    diag_step = c.diagnostics_every and step % c.diagnostics_every == 0
    for epoch in range(c.ppo_epochs):
      order = np.asarray(jax.random.permutation(jax.random.fold_in(k_perm, epoch), n_groups))
      for s in range(0, n_groups, per_mb):
        groups = order[s:s + per_mb]
        rows = (groups[:, None] * self.G + np.arange(self.G)[None, :]).reshape(-1)
        # [n, B/n, ...]: n micro-batches of whole groups (gradient accumulation).
        mb = jax.tree.map(
            lambda x, rows=rows: _put(x[rows].reshape((self.n_micro, -1) + x.shape[1:]),
                                      self.minibatch_sh), host_batch)
        # Diagnostics where the update is taken off-policy: every mini-batch after the first,
        # with the parameters about to be updated (at the first one, params == behaviour
        # policy: every ratio is 1 and all methods coincide). A step with a single update is
        # on-policy by construction; it is measured there and flagged.
        if diag_step and (len(update_metrics) > 0 or n_updates == 1):
          flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), mb)
          diags.append(self._diagnostics(self.state.params, batch=flat,
                                         token_counts=self.token_counts))
        self.state, m = self._update(self.state, mb)
        update_metrics.append(m)
    update_metrics = jax.device_get(update_metrics)
    if diags:
      diags = jax.device_get(diags)
      metrics.update({k: float(np.mean([d[k] for d in diags])) for k in diags[0]})
      metrics['diag/off_policy_points'] = len(diags) if n_updates > 1 else 0
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

  def _delta_weights(self, beh, out, adv_B, mask_BT, key):
    """DelTA coefficients from the behaviour pass's hidden states (no extra forward)."""
    extra = {}
    if self._delta_topk:
      extra = dict(unembed_VD=model_lib.lm_head_DV(self.state.params, self.model_config).T,
                   token_ids_BT=jnp.asarray(out.completion))
    lam_BT, metrics = self._delta(beh['hidden'], jnp.exp(beh['logps']), adv_B,
                                  jnp.asarray(mask_BT), rng=key, **extra)
    # The cloud averages lambda over the tokens DelTA scores (real tokens with A != 0).
    scored_BT = jnp.asarray(mask_BT) * (jnp.asarray(adv_B)[:, None] != 0)
    self.token_cloud = delta_lib.update_token_cloud(
        self.token_cloud, jnp.asarray(out.completion), lam_BT, scored_BT)
    return lam_BT, metrics

  def evaluate(self, step):
    """avg@k accuracy on the held-out problems at the config's decoding settings."""
    c = self.c
    key = jax.random.fold_in(jax.random.key(c.seed + 1), step)
    correct = []
    completions_all = []
    batch = c.rollout_chunk_prompts or c.prompts_per_step
    for s in range(0, len(self.eval_examples), batch):
      chunk = self.eval_examples[s:s + batch]
      n_real = len(chunk)
      chunk = chunk + [chunk[-1]] * (batch - n_real)  # one compiled shape
      tokens_BP, mask_BP = self._encode([ex['prompt'] for ex in chunk])
      out = _to_host(self._sample_eval(
          self.state.params, prompt_tokens_BP=tokens_BP, prompt_mask_BP=mask_BP,
          rng=jax.random.fold_in(key, s)))
      n_keep = n_real * c.eval_k
      completions = [self.tokenizer.decode(row[m > 0].tolist()) for row, m in
                     zip(out.completion[:n_keep], out.completion_mask[:n_keep])]
      rep = [ex for ex in chunk[:n_real] for _ in range(c.eval_k)]
      rewards = self.reward_fn([e['prompt'] for e in rep], completions,
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
    eval_every = c.eval_every if self.eval_examples else 0
    if start == 0 and eval_every:
      writer.write(0, self.evaluate(0))
    for step in range(start + 1, c.num_steps + 1):
      if c.token_budget and self.counters['generated_tokens'] >= c.token_budget:
        print(f'token budget {c.token_budget} reached at step {step - 1}', file=sys.stderr)
        break
      metrics = self.step(step)
      if eval_every and (step % eval_every == 0 or step == c.num_steps):
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
  logging.set_verbosity(logging.WARNING)  # orbax and tfds are chatty at INFO
  sharding_lib.initialize_distributed()  # multi-host: before any other JAX work
  trainer = Trainer(flags.FLAGS.config, flags.FLAGS.workdir)
  last = trainer.run(kill_after_step=flags.FLAGS.kill_after_step)
  print(json.dumps({k: v for k, v in last.items() if 'eval' in k or k in (
      'step', 'reward_mean', 'accuracy')}))


if __name__ == '__main__':
  define_flags()
  app.run(main)
