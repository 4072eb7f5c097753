"""Hugging Face checkpoints <-> jtc params, without torch.

Reads a Hugging Face model directory (``config.json`` plus one ``*.safetensors``
file or several shards listed in ``model.safetensors.index.json``) for the
architectures in ``SUPPORTED_ARCHITECTURES`` and returns a ``jtc.models.model.ModelConfig``
and a params pytree in the layout of ``jtc.models.model``. ``export_hf_checkpoint`` writes
the inverse, and ``load_hf_tokenizer`` reads ``tokenizer.json`` into the one
tokenizer class of jtc (`jtc.models.tokenizer.HFTokenizer`).

Safetensors files are read without torch by `jtc.models.safetensors_io` (memory-mapped,
bfloat16 through ``ml_dtypes``).

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
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import hf_config
from jtc.models import hf_tensors
from jtc.models import lora
from jtc.models.hf_config import CONFIG_FILE, CheckpointError, config_from_hf, hf_config_from
from jtc.models.hf_tensors import tensor_specs  # the tensors of a config (re-exported)
from jtc.models import model as model_lib
from jtc.models import safetensors_io
from jtc.models import tokenizer as tokenizer_lib
# The safetensors reader, re-exported beside the checkpoint loader that uses it.
from jtc.models.safetensors_io import INDEX_FILE, read_safetensors_header, read_tensor

Params = dict[str, Any]
PathLike = str | os.PathLike

SINGLE_FILE = 'model.safetensors'

# Tensors some checkpoints carry that carry no information for jtc.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)
# Qwen3.5's multi-token-prediction head and vision tower (Hugging Face skips them too).
_IGNORED_PREFIXES = ('mtp.', 'model.visual.')


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
  """Loads an HF Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE / Qwen3.5 checkpoint directory into
  jtc (a Qwen3.5 vision-language checkpoint: its text model).

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

  entries = safetensors_io.tensor_index(path)
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
  for spec in specs:
    if spec.hf_key not in entries:
      raise CheckpointError(f'Missing tensor {spec.hf_key!r} in {path} '
                            f'(looked in {sorted({e.file.name for e in entries.values()})}).')
    entry = entries[spec.hf_key]
    if entry.shape != spec.hf_shape:
      raise CheckpointError(
          f'Tensor {spec.hf_key!r} in {entry.file} has shape {list(entry.shape)}, expected '
          f'{list(spec.hf_shape)} from {config_file.name}.')
    if declared is not None and entry.dtype != declared and entry.dtype in safetensors_io.DTYPES:
      raise CheckpointError(
          f'dtype mismatch: tensor {spec.hf_key!r} in {entry.file} is {entry.dtype}, but '
          f'{CONFIG_FILE} declares {declared} (pass strict_dtype=False to cast anyway).')
    values = spec.to_jtc(read_tensor(entry, spec.hf_key))
    for jtc_path, value in zip(spec.paths, values if spec.parts else (values,)):
      value = value.astype(target)
      if spec.layer is None:
        _set_path(params, jtc_path, value)
      else:  # row `index` of the stacked [Y_s(, X), ...] array, allocated when row 0 is read
        if not any(spec.index):
          _set_path(params, jtc_path, np.empty(spec.lead + value.shape, target))
        _get_path(params, jtc_path)[spec.index] = value
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
  np_dtype = safetensors_io.DTYPES[hf_config.HF_DTYPE_NAMES[torch_dtype]]
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
        if value.shape[:len(spec.lead)] != spec.lead:
          raise ValueError(f"params/{'/'.join(jtc_path)} has shape {list(value.shape)}; "
                           f'expected leading axes {list(spec.lead)} (the layers of its stack'
                           f'{", the experts" if spec.expert is not None else ""}; n_layers='
                           f'{config.n_layers}).')
        value = value[spec.index]
      values.append(value)
    hf_value = np.ascontiguousarray(spec.to_hf(*values).astype(np_dtype))
    if hf_value.shape != spec.hf_shape:
      raise ValueError(f'params/{hf_tensors.spec_name(spec)} has shape {list(values[0].shape)}, '
                       f'which does not map to {spec.hf_key} {list(spec.hf_shape)}.')
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
