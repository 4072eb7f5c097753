"""Safetensors files read without torch: the 8-byte header length, the JSON header, raw
little-endian data memory-mapped with numpy (bfloat16 through ``ml_dtypes``, so it works on
every numpy / safetensors version and nothing is read twice), and a checkpoint directory's
tensors over one file or the shards of ``model.safetensors.index.json``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib

import ml_dtypes
import numpy as np

from jtc.models.hf_config import CheckpointError

PathLike = str | os.PathLike
INDEX_FILE = 'model.safetensors.index.json'

# safetensors dtype code -> numpy dtype. Only floating point weights are loadable.
DTYPES: dict[str, np.dtype] = {
    'F32': np.dtype(np.float32),
    'F16': np.dtype(np.float16),
    'BF16': np.dtype(ml_dtypes.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class TensorEntry:
  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]
  begin: int  # absolute byte offset in the file
  end: int


def read_safetensors_header(file: PathLike) -> dict[str, TensorEntry]:
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
    entry = TensorEntry(file, info['dtype'], tuple(info['shape']), 8 + header_len + begin,
                        8 + header_len + end)
    if not 8 + header_len <= entry.begin <= entry.end <= size:
      raise CheckpointError(f'{file} is truncated or corrupt: tensor {key!r} occupies bytes '
                            f'[{entry.begin}, {entry.end}) but the file has {size} bytes.')
    entries[key] = entry
  return entries


def read_tensor(entry: TensorEntry, key: str) -> np.ndarray:
  """Memory-maps one tensor as a numpy array of its stored dtype (bf16 via ml_dtypes)."""
  if entry.dtype not in DTYPES:
    raise CheckpointError(f'Unsupported dtype {entry.dtype!r} for tensor {key!r} in {entry.file}; '
                          f'supported: {sorted(DTYPES)}.')
  np_dtype = DTYPES[entry.dtype]
  n = math.prod(entry.shape)
  if entry.end - entry.begin != n * np_dtype.itemsize:
    raise CheckpointError(
        f'Tensor {key!r} in {entry.file}: byte range {entry.end - entry.begin} does not match '
        f'shape {list(entry.shape)} of {entry.dtype}.')
  if n == 0:
    return np.zeros(entry.shape, np_dtype)
  return np.memmap(entry.file, dtype=np_dtype, mode='r', offset=entry.begin, shape=entry.shape)


def tensor_index(path: pathlib.Path) -> dict[str, TensorEntry]:
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
  entries: dict[str, TensorEntry] = {}
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
