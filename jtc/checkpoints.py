"""Saving and restoring: policy bundles and resumable training checkpoints.

Two kinds of artefact, one place for both:

* A *policy bundle* is a directory holding everything needed to sample from a policy:
  `model.json` (the `ModelConfig`), `tokenizer.json` (a tokenizer spec, see
  `jtc.tokenizer`), `params.msgpack` (Flax serialisation) and `meta.json` (how it was made).
  Bundles in the earlier per-layer parameter layout (`layers_0` ...) load into the stacked
  layout of `jtc.model` (`model.stack_layers`).
  The default base policy ships inside the package as one (`jtc/assets/base_policy`).
  Bundles are written to a temporary directory and renamed into place, so a reader never sees
  half a bundle.
* A *training checkpoint* is an orbax `CheckpointManager` step under `<workdir>/checkpoints`
  with the train state (params, optimiser state, step), the PRNG key and a JSON item with the
  data-iterator state and the compute counters. Orbax finalises a step by an atomic rename; a
  step whose restore fails (partial or corrupt files) is skipped with a warning in favour of
  the previous one.
"""

import dataclasses
import json
import os
import shutil
import tempfile
import warnings

import flax.serialization
import jax
import orbax.checkpoint as ocp

from jtc import model as model_lib
from jtc import tokenizer as tokenizer_lib

BASE_POLICY_DIR = os.path.join(os.path.dirname(__file__), 'assets', 'base_policy')


@dataclasses.dataclass(frozen=True)
class PolicyBundle:
  model_config: model_lib.ModelConfig
  params: dict
  tokenizer: object
  tokenizer_spec: dict
  meta: dict


def resolve_policy_path(name_or_path):
  """'base' -> the shipped base policy; anything else is a directory path."""
  return BASE_POLICY_DIR if name_or_path == 'base' else name_or_path


def save_policy_bundle(path, *, model_config, params, tokenizer_spec, meta=None):
  """Writes a policy bundle to `path` atomically (temporary directory + rename)."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix='.tmp_bundle_', dir=parent)
  with open(os.path.join(tmp, 'model.json'), 'w') as f:
    json.dump(dataclasses.asdict(model_config), f, indent=1)
  with open(os.path.join(tmp, 'tokenizer.json'), 'w') as f:
    json.dump(tokenizer_spec, f, indent=1)
  with open(os.path.join(tmp, 'meta.json'), 'w') as f:
    json.dump(meta or {}, f, indent=1)
  with open(os.path.join(tmp, 'params.msgpack'), 'wb') as f:
    f.write(flax.serialization.to_bytes(jax.device_get(params)))
  if os.path.exists(path):
    old = path + '.old'
    shutil.rmtree(old, ignore_errors=True)
    os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(tmp, path)


def load_policy_bundle(name_or_path):
  """Reads a policy bundle ('base' = the one shipped with jtc)."""
  path = resolve_policy_path(name_or_path)
  needed = ('model.json', 'tokenizer.json', 'params.msgpack')
  missing = [n for n in needed if not os.path.exists(os.path.join(path, n))]
  if missing:
    raise FileNotFoundError(
        f'{path!r} is not a policy bundle: missing {missing} (a bundle has {list(needed)}; '
        "use 'base' for the shipped policy or a directory written by `python -m jtc.sft`)")
  with open(os.path.join(path, 'model.json')) as f:
    model_config = model_lib.ModelConfig(**json.load(f))
  with open(os.path.join(path, 'tokenizer.json')) as f:
    tokenizer_spec = json.load(f)
  meta = {}
  if os.path.exists(os.path.join(path, 'meta.json')):
    with open(os.path.join(path, 'meta.json')) as f:
      meta = json.load(f)
  template = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  with open(os.path.join(path, 'params.msgpack'), 'rb') as f:
    raw = flax.serialization.msgpack_restore(f.read())
  # Bundles written before the layers were stacked hold 'layers_0' .. 'layers_{Y-1}'; the
  # conversion only stacks them (values unchanged).
  params = flax.serialization.from_state_dict(template, model_lib.stack_layers(raw))
  mismatched = [
      f'{jax.tree_util.keystr(p)}: {getattr(x, "shape", None)} != {t.shape}'
      for (p, x), t in zip(jax.tree_util.tree_leaves_with_path(params),
                           jax.tree_util.tree_leaves(template))
      if getattr(x, 'shape', None) != t.shape]
  if mismatched:
    raise ValueError(f'{path!r}: params.msgpack does not match model.json: {mismatched[:3]}')
  return PolicyBundle(model_config=model_config, params=params,
                      tokenizer=tokenizer_lib.from_spec(tokenizer_spec),
                      tokenizer_spec=tokenizer_spec, meta=meta)


class TrainCheckpointer:
  """Orbax `CheckpointManager` for the train state, PRNG key and a JSON `extra` item."""

  def __init__(self, directory, *, max_to_keep=3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False))

  def save(self, step, *, state, extra):
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra)), force=True)
    self.manager.wait_until_finished()

  def restore_latest(self, state_template):
    """Returns (state, extra) of the newest readable step, or (None, None) if there is none."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(state_template), extra=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-except
        warnings.warn(f'checkpoint step {step} in {self.directory} is unreadable '
                      f'({type(e).__name__}: {e}); falling back to an earlier step')
        continue
      return restored.state, restored.extra
    return None, None

  def close(self):
    self.manager.close()
