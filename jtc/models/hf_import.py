"""Hugging Face checkpoints <-> jtc params, without torch.

Reads a Hugging Face model directory (``config.json`` plus one ``*.safetensors``
file or several shards listed in ``model.safetensors.index.json``) for the
architectures in ``SUPPORTED_ARCHITECTURES`` and returns a ``jtc.models.model.ModelConfig``
and a params pytree in the layout of ``jtc.models.model``. ``export_hf_checkpoint`` writes
the inverse, and ``load_hf_tokenizer`` reads ``tokenizer.json`` into the one
tokenizer class of jtc (`jtc.models.tokenizer.HFTokenizer`).

Safetensors files are parsed here (8-byte header length, JSON header, raw
little-endian data) and memory-mapped with numpy, so bfloat16 works on every
numpy/safetensors version (via ``ml_dtypes``) and nothing is read twice.

Which tensors a checkpoint holds and where each goes (the layout map): `jtc.models.hf_tensors`.

RoPE in jtc uses the same rotate-half convention as HF, so q/k need no permutation. RoPE
scaling: ``default``, ``linear`` and ``llama3`` (Llama-3.1/3.2), read from ``rope_scaling``
(transformers 4) or ``rope_parameters`` (transformers 5); a file with both that disagree is
rejected.

Dimension key (docs/dimensions.md): Y layers.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jtc.models import hf_config
from jtc.models import hf_tensors
from jtc.models import lora
from jtc.models.hf_config import CONFIG_FILE, CheckpointError, config_from_hf, hf_config_from
from jtc.models.hf_tensors import tensor_specs  # the tensors of a config (re-exported)
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib

Params = dict[str, Any]
PathLike = str | os.PathLike

INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'

# safetensors dtype code -> numpy dtype. Only floating point weights are loadable.
_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    'F32': np.dtype(np.float32),
    'F16': np.dtype(np.float16),
    'BF16': np.dtype(ml_dtypes.bfloat16),
}

# Tensors some checkpoints carry that carry no information for jtc.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)
# Qwen3.5's multi-token-prediction head and vision tower (Hugging Face skips them too).
_IGNORED_PREFIXES = ('mtp.', 'model.visual.')

# ----------------------------------------------------------------------------
# Safetensors reading (no torch, bf16-safe).
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorEntry:
  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]
  begin: int  # absolute byte offset in the file
  end: int


def read_safetensors_header(file: PathLike) -> dict[str, _TensorEntry]:
  """Parses a safetensors header: {key: (dtype code, shape, absolute byte range)}."""
  file = pathlib.Path(file)
  size = file.stat().st_size
  with open(file, 'rb') as f:
    raw_len = f.read(8)
    if len(raw_len) != 8:
      raise CheckpointError(f'{file} is not a safetensors file (shorter than 8 bytes).')
    header_len = int.from_bytes(raw_len, 'little')
    if header_len > size - 8:
      raise CheckpointError(f'{file} is not a safetensors file (header length {header_len} '
                            f'exceeds file size {size}).')
    try:
      header = json.loads(f.read(header_len))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f'{file} has an unreadable safetensors header: {e}') from e
  header.pop('__metadata__', None)
  entries = {}
  for key, info in header.items():
    begin, end = info['data_offsets']
    entry = _TensorEntry(file, info['dtype'], tuple(info['shape']), 8 + header_len + begin,
                         8 + header_len + end)
    if not 8 + header_len <= entry.begin <= entry.end <= size:
      raise CheckpointError(f'{file} is truncated or corrupt: tensor {key!r} occupies bytes '
                            f'[{entry.begin}, {entry.end}) but the file has {size} bytes.')
    entries[key] = entry
  return entries


def read_tensor(entry: _TensorEntry, key: str) -> np.ndarray:
  """Memory-maps one tensor as a numpy array of its stored dtype (bf16 via ml_dtypes)."""
  if entry.dtype not in _SAFETENSORS_DTYPES:
    raise CheckpointError(f'Unsupported dtype {entry.dtype!r} for tensor {key!r} in {entry.file}; '
                          f'supported: {sorted(_SAFETENSORS_DTYPES)}.')
  np_dtype = _SAFETENSORS_DTYPES[entry.dtype]
  n = math.prod(entry.shape)
  if entry.end - entry.begin != n * np_dtype.itemsize:
    raise CheckpointError(
        f'Tensor {key!r} in {entry.file}: byte range {entry.end - entry.begin} does not match '
        f'shape {list(entry.shape)} of {entry.dtype}.')
  if n == 0:
    return np.zeros(entry.shape, np_dtype)
  return np.memmap(entry.file, dtype=np_dtype, mode='r', offset=entry.begin, shape=entry.shape)


def _tensor_index(path: pathlib.Path) -> dict[str, _TensorEntry]:
  """{key: entry} over all safetensors files of a checkpoint directory."""
  index_file = path / INDEX_FILE
  if index_file.exists():
    weight_map = json.loads(index_file.read_text())['weight_map']
    files = sorted(set(weight_map.values()))
    for name in files:
      if not (path / name).exists():
        raise CheckpointError(f'{index_file} lists shard {name!r}, which does not exist in {path}.')
  else:
    weight_map = None
    files = sorted(p.name for p in path.glob('*.safetensors'))
    if not files:
      raise CheckpointError(f'No *.safetensors files (and no {INDEX_FILE}) in {path}.')
  entries: dict[str, _TensorEntry] = {}
  for name in files:
    for key, entry in read_safetensors_header(path / name).items():
      if key in entries:
        raise CheckpointError(
            f'Tensor {key!r} appears in both {entries[key].file} and {entry.file}.')
      if weight_map is not None and weight_map.get(key) not in (None, name):
        raise CheckpointError(
            f'{index_file} maps {key!r} to {weight_map[key]!r}, but it is in {name!r}.')
      entries[key] = entry
  if weight_map is not None:
    lost = sorted(set(weight_map) - set(entries))
    if lost:
      raise CheckpointError(f'{index_file} lists tensors not found in their shards: {lost[:5]}.')
  return entries


def _set_path(tree: dict, path: Sequence[str], value: Any) -> None:
  for name in path[:-1]:
    tree = tree.setdefault(name, {})
  tree[path[-1]] = value


def _get_path(tree: Mapping, path: Sequence[str]) -> Any:
  for name in path:
    tree = tree[name]
  return tree


def load_hf_checkpoint(path: PathLike, *, param_dtype: str | None = None, dtype: str | None = None,
                       max_seq_len: int | None = None, strict_dtype: bool = True,
                       as_numpy: bool = False) -> tuple[model_lib.ModelConfig, Params]:
  """Loads an HF Llama / Qwen2 / Qwen3 / Qwen3.5 checkpoint directory into jtc (a Qwen3.5
  vision-language checkpoint: its text model).

  Args:
    path: directory with ``config.json`` and ``*.safetensors`` (single or sharded
      with ``model.safetensors.index.json``).
    param_dtype: 'float32' | 'bfloat16'; default follows the checkpoint (bf16
      checkpoints stay bf16, everything else becomes f32).
    dtype: compute dtype; default ``param_dtype``.
    max_seq_len: default ``max_position_embeddings`` from ``config.json``.
    strict_dtype: if ``config.json`` declares ``torch_dtype``, every tensor must be
      stored in that dtype (a mismatch usually means a corrupted or mixed checkpoint).
    as_numpy: return host numpy arrays instead of jax arrays (e.g. to shard them
      yourself with ``jax.device_put``).

  Returns:
    ``(config, params)`` with params in the layout of ``jtc.models.model``.

  Raises:
    FileNotFoundError: no ``config.json``.
    CheckpointError (a ValueError): unsupported architecture / dtype, missing,
      unexpected or mis-shaped tensor; the message names the file and key.
  """
  path = pathlib.Path(path)
  config_file = path / CONFIG_FILE
  if not config_file.exists():
    raise FileNotFoundError(f'No {CONFIG_FILE} in {path}.')
  hf = json.loads(config_file.read_text())
  try:
    config = config_from_hf(hf, param_dtype=param_dtype, dtype=dtype, max_seq_len=max_seq_len)
  except CheckpointError as e:
    raise CheckpointError(f'{config_file}: {e}') from e
  declared = hf_config._hf_dtype_code(hf) if strict_dtype else None
  target = hf_config.JTC_DTYPES[config.param_dtype]

  entries = _tensor_index(path)
  specs = tensor_specs(config, prefix=hf_config.language_model(hf)[1])
  wanted = {s.hf_key for s in specs}
  unexpected = sorted(
      k for k in entries if k not in wanted and not k.endswith(_IGNORED_SUFFIXES) and
      not k.startswith(_IGNORED_PREFIXES) and not (config.tie_embeddings and k == 'lm_head.weight'))
  if unexpected:
    raise CheckpointError(
        f"Unexpected tensors for {hf['architectures'][0] if hf.get('architectures') else hf.get('model_type')} "
        f"in {path}: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
        f'(first in {entries[unexpected[0]].file.name}).')

  params: Params = {}
  Y = config.n_layers
  for spec in specs:
    if spec.hf_key not in entries:
      raise CheckpointError(f'Missing tensor {spec.hf_key!r} in {path} '
                            f'(looked in {sorted({e.file.name for e in entries.values()})}).')
    entry = entries[spec.hf_key]
    if entry.shape != spec.hf_shape:
      raise CheckpointError(
          f'Tensor {spec.hf_key!r} in {entry.file} has shape {list(entry.shape)}, expected '
          f'{list(spec.hf_shape)} from {config_file.name}.')
    if declared is not None and entry.dtype != declared and entry.dtype in _SAFETENSORS_DTYPES:
      raise CheckpointError(
          f'dtype mismatch: tensor {spec.hf_key!r} in {entry.file} is {entry.dtype}, but '
          f'{CONFIG_FILE} declares {declared} (pass strict_dtype=False to cast anyway).')
    values = spec.to_jtc(read_tensor(entry, spec.hf_key))
    for jtc_path, value in zip(spec.paths, values if spec.parts else (values,)):
      value = value.astype(target)
      if spec.layer is None:
        _set_path(params, jtc_path, value)
      else:  # row `layer` of the stacked [Y, ...] array, allocated when row 0 is read
        if spec.layer == 0:
          _set_path(params, jtc_path, np.empty((spec.rows or Y,) + value.shape, target))
        _get_path(params, jtc_path)[spec.layer] = value
  if not as_numpy:
    params = jax.tree_util.tree_map(jnp.asarray, params)
  return config, params


# ----------------------------------------------------------------------------
# Export.
# ----------------------------------------------------------------------------


def export_hf_checkpoint(config: model_lib.ModelConfig, params: Params, path: PathLike, *,
                         torch_dtype: str | None = None) -> pathlib.Path:
  """Writes `params` (or a `lora.Adapted` policy, merged) as an HF checkpoint directory
  (``config.json`` + ``model.safetensors``).

  The result loads with ``transformers.AutoModelForCausalLM.from_pretrained(path)``
  and with `load_hf_checkpoint`. Tokenizer files are not written.

  Args:
    torch_dtype: 'float32' | 'bfloat16' | 'float16' stored on disk; default
      ``config.param_dtype``.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  torch_dtype = torch_dtype or config.param_dtype
  if torch_dtype not in hf_config.HF_DTYPE_NAMES:
    raise ValueError(
        f'Unsupported torch_dtype={torch_dtype!r}; valid: {sorted(hf_config.HF_DTYPE_NAMES)}.')
  np_dtype = _SAFETENSORS_DTYPES[hf_config.HF_DTYPE_NAMES[torch_dtype]]
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  if isinstance(params, lora.Adapted):  # a LoRA policy: its merged weights, W + (alpha/r) A B
    params = params.merged()
  params = model_lib.stack_layers(params)  # the earlier per-layer layout is accepted too
  tensors, host = {}, {}
  for spec in tensor_specs(config):
    values = []
    for jtc_path in spec.paths:
      if jtc_path not in host:
        try:
          host[jtc_path] = np.asarray(jax.device_get(_get_path(params, jtc_path)))
        except KeyError as e:
          raise ValueError(f"params has no {'/'.join(jtc_path)} (needed for {spec.hf_key}).") from e
      value = host[jtc_path]
      if spec.layer is not None:
        rows = spec.rows or config.n_layers
        if value.ndim == 0 or value.shape[0] != rows:
          raise ValueError(f"params/{'/'.join(jtc_path)} has shape {list(value.shape)}; "
                           f'expected a leading layer axis of {rows} (n_layers='
                           f'{config.n_layers}).')
        value = value[spec.layer]
      values.append(value)
    hf_value = np.ascontiguousarray(spec.to_hf(*values).astype(np_dtype))
    if hf_value.shape != spec.hf_shape:
      raise ValueError(
          f'params/{hf_tensors.spec_name(spec)} has shape {list(values[0].shape)}, which '
          f'does not map to {spec.hf_key} {list(spec.hf_shape)}.')
    tensors[spec.hf_key] = hf_value
  save_file(tensors, str(path / SINGLE_FILE), metadata={'format': 'pt'})
  (path / CONFIG_FILE).write_text(
      json.dumps(hf_config_from(config, torch_dtype=torch_dtype), indent=2))
  return path


# ----------------------------------------------------------------------------
# Tokenizer.
# ----------------------------------------------------------------------------


def load_hf_tokenizer(path: PathLike) -> tokenizer_lib.HFTokenizer:
  """The checkpoint's tokenizer: `jtc.models.tokenizer.HFTokenizer.from_dir(path)` (``tokenizer.json``,
  special tokens and chat template from ``tokenizer_config.json``, EOS ids also from
  ``generation_config.json``). Kept here so that a checkpoint and its tokenizer load side by side."""
  return tokenizer_lib.HFTokenizer.from_dir(os.fspath(path))
