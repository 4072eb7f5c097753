"""Policy bundles: everything needed to sample from a policy, in one directory.

A bundle holds `model.json` (the `ModelConfig`), `tokenizer.json` (a tokenizer spec, see
`jtc.models.tokenizer`), `params.msgpack` (Flax serialisation) and `meta.json` (how it was made).
Bundles in the earlier per-layer parameter layout (`layers_0` ...) load into the stacked layout of
`jtc.models.model` (`model.stack_layers`). The policies jtc ships are bundles in `jtc/assets/`
(`SHIPPED`). Bundles are written to a temporary directory and renamed into place, so a reader
never sees half a bundle.
"""

import dataclasses
import json
import os
import shutil
import tempfile

import flax.serialization
import jax

from jtc import files
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib

ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'assets')
BASE_POLICY_DIR = os.path.join(ASSETS_DIR, 'base_policy')
# Policy bundles shipped with jtc, by name: the arithmetic base policy, the one of the phrasing
# task (configs/sft_phrasing.py) and the arithmetic mixture-of-experts policy
# (configs/sft_arith_moe.py).
SHIPPED = {
    'base': BASE_POLICY_DIR,
    'phrasing': os.path.join(ASSETS_DIR, 'phrasing_policy'),
    'moe': os.path.join(ASSETS_DIR, 'moe_policy')
}


@dataclasses.dataclass(frozen=True)
class PolicyBundle:
  model_config: model_lib.ModelConfig
  params: dict
  tokenizer: object
  tokenizer_spec: dict
  meta: dict


def resolve_policy_path(name_or_path):
  """A shipped bundle's name ('base', 'phrasing', 'moe') -> its directory; else a directory
  path."""
  return SHIPPED.get(name_or_path, name_or_path)


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


def read_model_config(path):
  """The `ModelConfig` stored in ``path`` (a bundle's or a ledger's model.json)."""
  fields = files.read_json(path, expected='a ModelConfig')
  # How the writer's mesh ran the experts is not the policy's: read back, they run anywhere.
  fields.pop('moe_dispatch', None)
  try:
    return model_lib.ModelConfig(**fields)
  except TypeError as e:  # an unknown or missing field
    raise files.DamagedFile(path, 'a ModelConfig', f'its fields do not fit ({e})') from None


def load_policy_bundle(name_or_path):
  """Reads a policy bundle ('base' = the one shipped with jtc)."""
  path = resolve_policy_path(name_or_path)
  needed = ('model.json', 'tokenizer.json', 'params.msgpack')
  missing = [n for n in needed if not os.path.exists(os.path.join(path, n))]
  if missing:
    raise FileNotFoundError(
        f'{path!r} is not a policy bundle: missing {missing} (a bundle has {list(needed)}; '
        "use 'base' for the shipped policy or a directory written by `python -m jtc.sft`)")
  model_config = read_model_config(os.path.join(path, 'model.json'))
  tokenizer_spec = files.read_json(os.path.join(path, 'tokenizer.json'),
                                   expected='a tokenizer spec (jtc.models.tokenizer.from_spec)')
  meta = {}
  if os.path.exists(os.path.join(path, 'meta.json')):
    meta = files.read_json(os.path.join(path, 'meta.json'), expected='how the bundle was made')
  template = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  params_path, expected = os.path.join(path, 'params.msgpack'), 'the parameters of model.json'
  raw = files.read_msgpack(params_path, expected=expected)
  # Bundles written before the layers were stacked hold 'layers_0' .. 'layers_{Y-1}'; the
  # conversion only stacks them (values unchanged).
  params = files.restore_tree(params_path, template, model_lib.stack_layers(raw), expected=expected)
  return PolicyBundle(model_config=model_config, params=params,
                      tokenizer=tokenizer_lib.from_spec(tokenizer_spec),
                      tokenizer_spec=tokenizer_spec, meta=meta)
