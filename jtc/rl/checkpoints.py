"""Resumable training checkpoints, and a run's policy from its config.

A *training checkpoint* is an orbax `CheckpointManager` step under `<workdir>/checkpoints`
with the train state (params, optimiser state, step), the run state (counters, token counts,
the token-weight plug-in's state; arrays) and a JSON item with the data-iterator state and
the config. Orbax finalises a step by an atomic rename; a step whose restore fails (partial or
corrupt files) is moved aside, never deleted, in favour of the previous one; a step written by
another model (other shapes) is refused (`CheckpointMismatch`). Policy bundles (what a run starts
from) are `jtc.models.bundles`.
"""

import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from jtc import files
from jtc.models import bundles
from jtc.models import tokenizer as tokenizer_lib
from jtc.models.model_config import MOE_DISPATCHES


def check_policy_config(policy):
  """A config's `policy` section, before any compute."""
  if not policy.checkpoint and not policy.init:
    raise ValueError('config.policy.checkpoint (a Hugging Face model directory) or '
                     'config.policy.init (a jtc policy bundle) is required')
  if policy.checkpoint and not os.path.isfile(os.path.join(policy.checkpoint, 'config.json')):
    raise ValueError(f'config.policy.checkpoint={policy.checkpoint!r} is not a Hugging Face '
                     'model directory (no config.json)')
  if (not policy.checkpoint and
      not os.path.isfile(os.path.join(bundles.resolve_policy_path(policy.init), 'model.json'))):
    raise ValueError(f'config.policy.init={policy.init!r} is neither a shipped policy '
                     f'({sorted(bundles.SHIPPED)}) nor a policy bundle directory (no model.json)')
  dispatch = policy.get('moe_dispatch', 'replicated')
  if dispatch not in MOE_DISPATCHES:
    raise ValueError(f'config.policy.moe_dispatch={dispatch!r} is not one of '
                     f'{list(MOE_DISPATCHES)}')
  for key in ('param_dtype', 'compute_dtype', 'ref_param_dtype'):
    if policy[key] not in ('', 'float32', 'bfloat16'):
      raise ValueError(f"config.policy.{key}={policy[key]!r} is not valid; valid: '' (the "
                       "policy's own), 'bfloat16', 'float32'")


def cast_floats(tree, dtype):
  """Every floating leaf of ``tree`` as ``dtype`` (integer leaves unchanged)."""
  return jax.tree.map(lambda x: x.astype(dtype)
                      if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def frozen_copy(params, dtype, shardings):
  """A copy of ``params`` cast to ``dtype`` in new buffers (the KL reference policy: never
  aliased with the state that the update step donates)."""
  return jax.jit(lambda p: cast_floats(p, dtype), out_shardings=shardings)(params)


def policy_model_config(policy, model_config, platform):
  """``model_config`` with the policy section's dtypes, remat, attention (its 'auto' resolved for
  ``platform``, the devices that will run it: `attention.resolve`) and overrides."""
  from jtc.models import attention  # pylint: disable=import-outside-toplevel
  overrides = {
      k: v for k, v in (('param_dtype', policy.param_dtype), ('dtype', policy.compute_dtype),
                        ('remat', policy.remat)) if v
  }
  overrides['moe_dispatch'] = policy.get('moe_dispatch', 'replicated')  # `models.moe_dispatch`
  overrides['attention'] = attention.resolve(policy.get('attention', 'auto'), platform)
  return dataclasses.replace(model_config, **{**overrides, **dict(policy.overrides)})


def load_policy(policy):
  """(model_config, params on host, tokenizer) from a config's `policy` section: a Hugging Face
  directory (`hf_import`) or a policy bundle, then the section's dtypes / remat / overrides (the
  params are cast to the master `param_dtype`)."""
  from jtc.models import hf_import  # pylint: disable=import-outside-toplevel
  if policy.checkpoint:
    model_config, params = hf_import.load_hf_checkpoint(policy.checkpoint,
                                                        param_dtype=policy.param_dtype or None,
                                                        dtype=policy.compute_dtype or None,
                                                        as_numpy=True)
    tokenizer = tokenizer_lib.HFTokenizer.from_dir(policy.checkpoint)
  else:
    bundle = bundles.load_policy_bundle(policy.init)
    model_config, params, tokenizer = bundle.model_config, bundle.params, bundle.tokenizer
  model_config = policy_model_config(policy, model_config, jax.devices()[0].platform)
  params = cast_floats(jax.device_get(params), model_config.jnp_param_dtype)
  for name in ('eos_id', 'pad_id'):
    tid = getattr(tokenizer, name)
    if tid is None or not 0 <= tid < model_config.vocab_size:
      raise ValueError(f'tokenizer {name}={tid!r} is not a token of the model (vocab_size='
                       f'{model_config.vocab_size})')
  return model_config, params, tokenizer


class CheckpointMismatch(ValueError):
  """A checkpoint that is readable but belongs to another model or optimiser (other shapes or
  structure): incompatible, not unreadable. Nothing is moved or deleted."""


def _key_name(k):
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _shapes(tree):
  """{path: shape} of a pytree's leaves; paths as tuples of names, so a stored metadata tree
  (nested dicts and lists) and a template (dataclasses, named tuples) compare equal."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {tuple(_key_name(k) for k in path): tuple(getattr(x, 'shape', ())) for path, x in leaves}


class TrainCheckpointer:
  """Orbax `CheckpointManager` of a run: the train state and the run state (both pytrees of
  arrays) and a JSON `extra` item (the data-iterator state and the config).

  `restore_latest` never deletes anything: a step that cannot be read (partial or corrupt
  files) is moved aside to `<directory>/unreadable/<step>-<unix time>` with a one-line warning
  and the previous step is tried; a step that reads but does not fit the run (another model's shapes)
  raises `CheckpointMismatch`.
  """

  def __init__(self, directory, *, max_to_keep=3):
    self.directory = os.path.abspath(directory)
    # Handlers registered up front, so a step's metadata can be read before any restore.
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                             enable_async_checkpointing=False),
        item_names=('state', 'run', 'extra'), item_handlers={
            'state': ocp.StandardCheckpointHandler(),
            'run': ocp.StandardCheckpointHandler(),
            'extra': ocp.JsonCheckpointHandler()
        })

  def save(self, step, *, state, run_state, extra):
    self.manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      run=ocp.args.StandardSave(run_state),
                                      extra=ocp.args.JsonSave(extra)), force=True)
    self.manager.wait_until_finished()

  def _check_fits(self, step, name, template):
    """Raises CheckpointMismatch when the stored item's structure or shapes differ from
    ``template``'s; returns quietly when they match or the metadata cannot be read."""
    try:
      stored = self.manager.item_metadata(step)[name]
    except Exception:  # pylint: disable=broad-except
      return  # unreadable metadata: the restore fails and the step is moved aside
    if stored is None:
      return
    want, got = _shapes(template), _shapes(stored)
    if got != want:
      missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
      if missing or extra:
        diff = (f'{len(got)} stored arrays, {len(want)} expected; e.g. '
                f'{"/".join((missing or extra)[0])} is {"missing" if missing else "extra"}')
      else:
        path = next(p for p in want if got[p] != want[p])
        diff = f'{"/".join(path)} has shape {got[path]} stored, {want[path]} expected'
      raise CheckpointMismatch(
          f'checkpoint step {step} in {self.directory} does not fit this run ({name}: stored '
          f'structure differs from the model / optimiser of the config: {diff}). '
          'It was written by a run of another model or config; use another --workdir. '
          'Nothing was changed.')

  def _move_aside(self, step, error):
    src = os.path.join(self.directory, str(step))
    dst_dir = os.path.join(self.directory, 'unreadable')
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, f'{step}-{int(time.time())}')
    os.rename(src, dst)
    self.manager.reload()
    reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ''
    print(
        f'warning: checkpoint step {step} is unreadable ({type(error).__name__}: {reason}); '
        f'moved to {dst}, resuming from the previous step', file=sys.stderr)

  def restore_latest(self, state_template, run_template):
    """(state, run_state, extra) of the newest readable step, or None when there is no step;
    a `files.DamagedFile` when every step was unreadable (starting over would replace the
    run's metrics)."""
    steps = sorted(self.manager.all_steps(), reverse=True)
    for step in steps:
      self._check_fits(step, 'state', state_template)
      self._check_fits(step, 'run', run_template)
      try:
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(state_template),
                                          run=ocp.args.StandardRestore(run_template),
                                          extra=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-except
        self._move_aside(step, e)
        continue
      return restored.state, restored.run, restored.extra
    if steps:
      raise files.DamagedFile(
          self.directory, 'at least one readable checkpoint step',
          f'every step ({sorted(steps)}) failed to restore and was moved to '
          f'{os.path.join(self.directory, "unreadable")}',
          hint='the run cannot resume, and starting over here would replace its metrics: use '
          'another --workdir')
    return None

  def close(self):
    self.manager.close()
