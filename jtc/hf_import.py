"""Hugging Face checkpoints <-> jtc params, without torch.

Reads a Hugging Face model directory (``config.json`` plus one ``*.safetensors``
file or several shards listed in ``model.safetensors.index.json``) for the
architectures in ``SUPPORTED_ARCHITECTURES`` and returns a ``jtc.model.ModelConfig``
and a params pytree in the layout of ``jtc.model``. ``export_hf_checkpoint`` writes
the inverse, and ``load_hf_tokenizer`` reads ``tokenizer.json`` with the
``tokenizers`` library.

Safetensors files are parsed here (8-byte header length, JSON header, raw
little-endian data) and memory-mapped with numpy, so bfloat16 works on every
numpy/safetensors version (via ``ml_dtypes``) and nothing is read twice.

Layout map (HF ``nn.Linear`` weights are ``[out, in]``; jtc kernels are ``[in, ...out]``):

  model.embed_tokens.weight            [V, D]     -> embed/embedding            [V, D]
  model.layers.i.self_attn.q_proj.weight [N*H, D] -> layers_i/attn/q/kernel     [D, N, H]
  model.layers.i.self_attn.q_proj.bias   [N*H]    -> layers_i/attn/q/bias       [N, H]
  model.layers.i.self_attn.{k,v}_proj.weight [K*H, D] -> layers_i/attn/{k,v}/kernel [D, K, H]
  model.layers.i.self_attn.o_proj.weight [D, N*H] -> layers_i/attn/o/kernel     [N, H, D]
  model.layers.i.self_attn.{q,k}_norm.weight [H]  -> layers_i/attn/{q,k}_norm/scale [H]
  model.layers.i.input_layernorm.weight  [D]      -> layers_i/attn_norm/scale   [D]
  model.layers.i.post_attention_layernorm.weight -> layers_i/mlp_norm/scale    [D]
  model.layers.i.mlp.{gate,up}_proj.weight [F, D] -> layers_i/mlp/{gate,up}/kernel [D, F]
  model.layers.i.mlp.down_proj.weight    [D, F]   -> layers_i/mlp/down/kernel   [F, D]
  model.norm.weight                      [D]      -> final_norm/scale           [D]
  lm_head.weight                         [V, D]   -> lm_head/kernel             [D, V]

RoPE in jtc uses the same rotate-half convention as HF, so q/k need no permutation.

Dimension key: V vocab, D model dim, N query heads, K kv heads, H head dim, F mlp dim.
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

from jtc import model as model_lib

Params = dict[str, Any]
PathLike = str | os.PathLike

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# safetensors dtype code -> numpy dtype. Only floating point weights are loadable.
_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
# Codes that exist in the format but that we refuse (quantised / integer tensors).
_KNOWN_UNSUPPORTED_DTYPES = (
    "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2",
)
# config.json "torch_dtype"/"dtype" value -> safetensors code.
_HF_DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# jtc dtype names (ModelConfig.param_dtype / dtype) -> numpy dtype.
_JTC_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


class CheckpointError(ValueError):
  """A Hugging Face checkpoint directory that jtc cannot load as asked."""


# ----------------------------------------------------------------------------
# Architectures: config.json -> the two architecture flags of ModelConfig.
# ----------------------------------------------------------------------------


def _llama_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Llama's `attention_bias` also puts a bias on o_proj, which jtc has no slot for.
  _require_false(hf, "attention_bias", "LlamaForCausalLM")
  _require_false(hf, "mlp_bias", "LlamaForCausalLM")
  return dict(qk_norm=False, attn_bias=False)


def _qwen2_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Qwen2 always has biases on q/k/v (never on o_proj or the MLP).
  _require_false(hf, "use_sliding_window", "Qwen2ForCausalLM")
  return dict(qk_norm=False, attn_bias=True)


def _qwen3_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Qwen3's `attention_bias` would also put a bias on o_proj.
  _require_false(hf, "attention_bias", "Qwen3ForCausalLM")
  _require_false(hf, "use_sliding_window", "Qwen3ForCausalLM")
  return dict(qk_norm=True, attn_bias=False)


SUPPORTED_ARCHITECTURES: dict[str, Callable[[Mapping[str, Any]], dict[str, bool]]] = {
    "LlamaForCausalLM": _llama_flags,
    "Qwen2ForCausalLM": _qwen2_flags,
    "Qwen3ForCausalLM": _qwen3_flags,
}
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _require_false(hf: Mapping[str, Any], key: str, arch: str) -> None:
  if hf.get(key):
    raise CheckpointError(
        f"{arch} with {key}={hf[key]!r} in {CONFIG_FILE} is not supported by jtc.model "
        f"(only {key}=false).")


def _architecture(hf: Mapping[str, Any]) -> str:
  archs = hf.get("architectures") or []
  if not archs and hf.get("model_type") in _MODEL_TYPES:
    archs = [_MODEL_TYPES[hf["model_type"]]]
  if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(
        f"Unsupported architecture {archs!r} (model_type={hf.get('model_type')!r}) in "
        f"{CONFIG_FILE}; supported: {sorted(SUPPORTED_ARCHITECTURES)}.")
  return archs[0]


def _rope_theta(hf: Mapping[str, Any]) -> float:
  """RoPE base; only plain (unscaled) RoPE is implemented by jtc.model."""
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type != "default":
    raise CheckpointError(
        f"RoPE scaling rope_type={rope_type!r} in {CONFIG_FILE} is not supported by "
        "jtc.model; supported: ['default'].")
  theta = hf.get("rope_theta", rope.get("rope_theta"))
  if theta is None:
    raise CheckpointError(f"{CONFIG_FILE} has neither 'rope_theta' nor 'rope_parameters.rope_theta'.")
  return float(theta)


def _hf_dtype_code(hf: Mapping[str, Any]) -> str | None:
  name = hf.get("torch_dtype", hf.get("dtype"))
  if name is None:
    return None
  if name not in _HF_DTYPE_NAMES:
    raise CheckpointError(
        f"Unsupported dtype {name!r} in {CONFIG_FILE}; supported: {sorted(_HF_DTYPE_NAMES)}.")
  return _HF_DTYPE_NAMES[name]


def _check_jtc_dtype(name: str, what: str) -> str:
  if name not in _JTC_DTYPES:
    raise ValueError(f"Unsupported {what}={name!r}; valid: {sorted(_JTC_DTYPES)}.")
  return name


def config_from_hf(hf_config: Mapping[str, Any], *, param_dtype: str | None = None,
                   dtype: str | None = None,
                   max_seq_len: int | None = None) -> model_lib.ModelConfig:
  """Builds a `ModelConfig` from a parsed HF ``config.json``.

  Args:
    hf_config: the ``config.json`` dict.
    param_dtype: 'float32' or 'bfloat16'. Default: 'bfloat16' if the checkpoint
      declares bfloat16, else 'float32'.
    dtype: compute dtype; default equals ``param_dtype``.
    max_seq_len: default ``max_position_embeddings``.
  """
  hf = hf_config
  flags = SUPPORTED_ARCHITECTURES[_architecture(hf)](hf)
  act = hf.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise CheckpointError(f"hidden_act={act!r} in {CONFIG_FILE} is not supported; supported: ['silu'].")
  required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "rms_norm_eps")
  missing = [k for k in required if k not in hf]
  if missing:
    raise CheckpointError(f"{CONFIG_FILE} is missing keys {missing}.")
  n_heads = int(hf["num_attention_heads"])
  head_dim = hf.get("head_dim") or hf["hidden_size"] // n_heads
  if param_dtype is None:
    param_dtype = "bfloat16" if _hf_dtype_code(hf) == "BF16" else "float32"
  _check_jtc_dtype(param_dtype, "param_dtype")
  dtype = _check_jtc_dtype(dtype or param_dtype, "dtype")
  return model_lib.ModelConfig(
      vocab_size=int(hf["vocab_size"]),
      d_model=int(hf["hidden_size"]),
      n_layers=int(hf["num_hidden_layers"]),
      n_heads=n_heads,
      n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
      head_dim=int(head_dim),
      d_ff=int(hf["intermediate_size"]),
      rope_theta=_rope_theta(hf),
      norm_eps=float(hf["rms_norm_eps"]),
      qk_norm=flags["qk_norm"],
      attn_bias=flags["attn_bias"],
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      param_dtype=param_dtype,
      dtype=dtype,
      max_seq_len=int(max_seq_len or hf.get("max_position_embeddings", 4096)),
  )


def architecture_for(config: model_lib.ModelConfig) -> str:
  """The HF architecture that represents `config` (used by the exporter)."""
  if config.qk_norm and config.attn_bias:
    raise ValueError("No supported HF architecture has both qk_norm and attn_bias "
                     f"(supported: {sorted(SUPPORTED_ARCHITECTURES)}).")
  if config.qk_norm:
    return "Qwen3ForCausalLM"
  if config.attn_bias:
    return "Qwen2ForCausalLM"
  return "LlamaForCausalLM"


def hf_config_from(config: model_lib.ModelConfig, *, torch_dtype: str = "float32") -> dict[str, Any]:
  """Inverse of `config_from_hf`: a ``config.json`` dict for `config`."""
  arch = architecture_for(config)
  model_type = {v: k for k, v in _MODEL_TYPES.items()}[arch]
  hf: dict[str, Any] = dict(
      architectures=[arch], model_type=model_type,
      vocab_size=config.vocab_size, hidden_size=config.d_model,
      intermediate_size=config.d_ff, num_hidden_layers=config.n_layers,
      num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
      head_dim=config.head_dim, hidden_act="silu",
      max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
      rope_theta=config.rope_theta, rope_scaling=None,
      tie_word_embeddings=config.tie_embeddings, torch_dtype=torch_dtype,
      use_cache=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
  )
  if arch != "Qwen2ForCausalLM":
    hf.update(attention_bias=False)
  if arch == "LlamaForCausalLM":
    hf.update(mlp_bias=False)
  else:
    hf.update(use_sliding_window=False, sliding_window=None)
  return hf


# ----------------------------------------------------------------------------
# Tensor name / layout mapping.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
  """One HF tensor and where it goes in the jtc params tree."""
  hf_key: str
  jtc_path: tuple[str, ...]
  hf_shape: tuple[int, ...]
  to_jtc: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _same(x: np.ndarray) -> np.ndarray:
  return x


def _transpose(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def _in_proj(n: int, h: int) -> tuple[Callable, Callable]:
  """[n*h, D] (HF) <-> [D, n, h] (jtc)."""
  to_jtc = lambda w: np.ascontiguousarray(w.T).reshape(w.shape[1], n, h)
  to_hf = lambda k: np.ascontiguousarray(k.reshape(k.shape[0], n * h).T)
  return to_jtc, to_hf


def _in_bias(n: int, h: int) -> tuple[Callable, Callable]:
  """[n*h] (HF) <-> [n, h] (jtc)."""
  return (lambda b: b.reshape(n, h)), (lambda b: b.reshape(n * h))


def _out_proj(n: int, h: int) -> tuple[Callable, Callable]:
  """[D, n*h] (HF) <-> [n, h, D] (jtc)."""
  to_jtc = lambda w: np.ascontiguousarray(w.T).reshape(n, h, w.shape[0])
  to_hf = lambda k: np.ascontiguousarray(k.reshape(n * h, k.shape[-1]).T)
  return to_jtc, to_hf


def tensor_specs(config: model_lib.ModelConfig) -> list[_TensorSpec]:
  """Every tensor a checkpoint of `config` must contain, in file order."""
  V, D, F = config.vocab_size, config.d_model, config.d_ff
  N, K, H = config.n_heads, config.n_kv_heads, config.head_dim
  specs = [_TensorSpec("model.embed_tokens.weight", ("embed", "embedding"), (V, D), _same, _same)]
  for i in range(config.n_layers):
    hf = f"model.layers.{i}."
    jl = f"layers_{i}"
    attn = [("q", N), ("k", K), ("v", K)]
    for name, heads in attn:
      specs.append(_TensorSpec(f"{hf}self_attn.{name}_proj.weight", (jl, "attn", name, "kernel"),
                               (heads * H, D), *_in_proj(heads, H)))
      if config.attn_bias:
        specs.append(_TensorSpec(f"{hf}self_attn.{name}_proj.bias", (jl, "attn", name, "bias"),
                                 (heads * H,), *_in_bias(heads, H)))
    specs.append(_TensorSpec(f"{hf}self_attn.o_proj.weight", (jl, "attn", "o", "kernel"),
                             (D, N * H), *_out_proj(N, H)))
    if config.qk_norm:
      for name in ("q_norm", "k_norm"):
        specs.append(_TensorSpec(f"{hf}self_attn.{name}.weight", (jl, "attn", name, "scale"),
                                 (H,), _same, _same))
    for name in ("gate", "up"):
      specs.append(_TensorSpec(f"{hf}mlp.{name}_proj.weight", (jl, "mlp", name, "kernel"),
                               (F, D), _transpose, _transpose))
    specs.append(_TensorSpec(f"{hf}mlp.down_proj.weight", (jl, "mlp", "down", "kernel"),
                             (D, F), _transpose, _transpose))
    specs.append(_TensorSpec(f"{hf}input_layernorm.weight", (jl, "attn_norm", "scale"),
                             (D,), _same, _same))
    specs.append(_TensorSpec(f"{hf}post_attention_layernorm.weight", (jl, "mlp_norm", "scale"),
                             (D,), _same, _same))
  specs.append(_TensorSpec("model.norm.weight", ("final_norm", "scale"), (D,), _same, _same))
  if not config.tie_embeddings:
    specs.append(_TensorSpec("lm_head.weight", ("lm_head", "kernel"), (V, D), _transpose, _transpose))
  return specs


# Tensors some checkpoints carry that carry no information for jtc.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
  with open(file, "rb") as f:
    raw_len = f.read(8)
    if len(raw_len) != 8:
      raise CheckpointError(f"{file} is not a safetensors file (shorter than 8 bytes).")
    header_len = int.from_bytes(raw_len, "little")
    if header_len > size - 8:
      raise CheckpointError(f"{file} is not a safetensors file (header length {header_len} "
                            f"exceeds file size {size}).")
    try:
      header = json.loads(f.read(header_len))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{file} has an unreadable safetensors header: {e}") from e
  header.pop("__metadata__", None)
  entries = {}
  for key, info in header.items():
    begin, end = info["data_offsets"]
    entries[key] = _TensorEntry(file, info["dtype"], tuple(info["shape"]),
                                8 + header_len + begin, 8 + header_len + end)
  return entries


def read_tensor(entry: _TensorEntry, key: str) -> np.ndarray:
  """Memory-maps one tensor as a numpy array of its stored dtype (bf16 via ml_dtypes)."""
  if entry.dtype not in _SAFETENSORS_DTYPES:
    raise CheckpointError(
        f"Unsupported dtype {entry.dtype!r} for tensor {key!r} in {entry.file}; "
        f"supported: {sorted(_SAFETENSORS_DTYPES)}.")
  np_dtype = _SAFETENSORS_DTYPES[entry.dtype]
  n = math.prod(entry.shape)
  if entry.end - entry.begin != n * np_dtype.itemsize:
    raise CheckpointError(
        f"Tensor {key!r} in {entry.file}: byte range {entry.end - entry.begin} does not match "
        f"shape {list(entry.shape)} of {entry.dtype}.")
  if n == 0:
    return np.zeros(entry.shape, np_dtype)
  return np.memmap(entry.file, dtype=np_dtype, mode="r", offset=entry.begin,
                   shape=entry.shape)


def _tensor_index(path: pathlib.Path) -> dict[str, _TensorEntry]:
  """{key: entry} over all safetensors files of a checkpoint directory."""
  index_file = path / INDEX_FILE
  if index_file.exists():
    weight_map = json.loads(index_file.read_text())["weight_map"]
    files = sorted(set(weight_map.values()))
    for name in files:
      if not (path / name).exists():
        raise CheckpointError(f"{index_file} lists shard {name!r}, which does not exist in {path}.")
  else:
    weight_map = None
    files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
      raise CheckpointError(f"No *.safetensors files (and no {INDEX_FILE}) in {path}.")
  entries: dict[str, _TensorEntry] = {}
  for name in files:
    for key, entry in read_safetensors_header(path / name).items():
      if key in entries:
        raise CheckpointError(f"Tensor {key!r} appears in both {entries[key].file} and {entry.file}.")
      if weight_map is not None and weight_map.get(key) not in (None, name):
        raise CheckpointError(f"{index_file} maps {key!r} to {weight_map[key]!r}, but it is in {name!r}.")
      entries[key] = entry
  if weight_map is not None:
    lost = sorted(set(weight_map) - set(entries))
    if lost:
      raise CheckpointError(f"{index_file} lists tensors not found in their shards: {lost[:5]}.")
  return entries


def _set_path(tree: dict, path: Sequence[str], value: Any) -> None:
  for name in path[:-1]:
    tree = tree.setdefault(name, {})
  tree[path[-1]] = value


def _get_path(tree: Mapping, path: Sequence[str]) -> Any:
  for name in path:
    tree = tree[name]
  return tree


def load_hf_checkpoint(path: PathLike, *, param_dtype: str | None = None,
                       dtype: str | None = None, max_seq_len: int | None = None,
                       strict_dtype: bool = True,
                       as_numpy: bool = False) -> tuple[model_lib.ModelConfig, Params]:
  """Loads an HF Llama / Qwen2 / Qwen3 checkpoint directory into jtc.

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
    ``(config, params)`` with params in the layout of ``jtc.model``.

  Raises:
    FileNotFoundError: no ``config.json``.
    CheckpointError (a ValueError): unsupported architecture / dtype, missing,
      unexpected or mis-shaped tensor; the message names the file and key.
  """
  path = pathlib.Path(path)
  config_file = path / CONFIG_FILE
  if not config_file.exists():
    raise FileNotFoundError(f"No {CONFIG_FILE} in {path}.")
  hf = json.loads(config_file.read_text())
  try:
    config = config_from_hf(hf, param_dtype=param_dtype, dtype=dtype, max_seq_len=max_seq_len)
  except CheckpointError as e:
    raise CheckpointError(f"{config_file}: {e}") from e
  declared = _hf_dtype_code(hf) if strict_dtype else None
  target = _JTC_DTYPES[config.param_dtype]

  entries = _tensor_index(path)
  specs = tensor_specs(config)
  wanted = {s.hf_key for s in specs}
  unexpected = sorted(
      k for k in entries
      if k not in wanted and not k.endswith(_IGNORED_SUFFIXES)
      and not (config.tie_embeddings and k == "lm_head.weight"))
  if unexpected:
    raise CheckpointError(
        f"Unexpected tensors for {hf['architectures'][0] if hf.get('architectures') else hf.get('model_type')} "
        f"in {path}: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
        f"(first in {entries[unexpected[0]].file.name}).")

  params: Params = {}
  for spec in specs:
    if spec.hf_key not in entries:
      raise CheckpointError(f"Missing tensor {spec.hf_key!r} in {path} "
                            f"(looked in {sorted({e.file.name for e in entries.values()})}).")
    entry = entries[spec.hf_key]
    if entry.shape != spec.hf_shape:
      raise CheckpointError(
          f"Tensor {spec.hf_key!r} in {entry.file} has shape {list(entry.shape)}, expected "
          f"{list(spec.hf_shape)} from {config_file.name}.")
    if declared is not None and entry.dtype != declared and entry.dtype in _SAFETENSORS_DTYPES:
      raise CheckpointError(
          f"dtype mismatch: tensor {spec.hf_key!r} in {entry.file} is {entry.dtype}, but "
          f"{CONFIG_FILE} declares {declared} (pass strict_dtype=False to cast anyway).")
    value = spec.to_jtc(read_tensor(entry, spec.hf_key)).astype(target)
    _set_path(params, spec.jtc_path, value if as_numpy else jnp.asarray(value))
  return config, params


# ----------------------------------------------------------------------------
# Export.
# ----------------------------------------------------------------------------


def export_hf_checkpoint(config: model_lib.ModelConfig, params: Params, path: PathLike, *,
                         torch_dtype: str | None = None) -> pathlib.Path:
  """Writes `params` as an HF checkpoint directory (``config.json`` + ``model.safetensors``).

  The result loads with ``transformers.AutoModelForCausalLM.from_pretrained(path)``
  and with `load_hf_checkpoint`. Tokenizer files are not written.

  Args:
    torch_dtype: 'float32' | 'bfloat16' | 'float16' stored on disk; default
      ``config.param_dtype``.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  torch_dtype = torch_dtype or config.param_dtype
  if torch_dtype not in _HF_DTYPE_NAMES:
    raise ValueError(f"Unsupported torch_dtype={torch_dtype!r}; valid: {sorted(_HF_DTYPE_NAMES)}.")
  np_dtype = _SAFETENSORS_DTYPES[_HF_DTYPE_NAMES[torch_dtype]]
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tensors = {}
  for spec in tensor_specs(config):
    try:
      value = np.asarray(jax.device_get(_get_path(params, spec.jtc_path)))
    except KeyError as e:
      raise ValueError(f"params has no {'/'.join(spec.jtc_path)} (needed for {spec.hf_key}).") from e
    hf_value = np.ascontiguousarray(spec.to_hf(value).astype(np_dtype))
    if hf_value.shape != spec.hf_shape:
      raise ValueError(f"params/{'/'.join(spec.jtc_path)} has shape {list(value.shape)}, which "
                       f"does not map to {spec.hf_key} {list(spec.hf_shape)}.")
    tensors[spec.hf_key] = hf_value
  save_file(tensors, str(path / SINGLE_FILE), metadata={"format": "pt"})
  (path / CONFIG_FILE).write_text(json.dumps(hf_config_from(config, torch_dtype=torch_dtype), indent=2))
  return path


# ----------------------------------------------------------------------------
# Tokenizer.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HFTokenizer:
  """A `tokenizers.Tokenizer` plus the special tokens of an HF checkpoint.

  Attributes:
    tokenizer: the fast tokenizer from ``tokenizer.json``.
    eos_ids: every id that ends generation (``tokenizer_config.json`` eos token
      first, then ``generation_config.json`` ``eos_token_id``s); may be empty.
    eos_id / pad_id / bos_id: single ids, or None when the checkpoint has none.
      ``pad_id`` falls back to ``eos_id`` when no pad token is declared.
    chat_template: the Jinja chat template string, or None.
  """
  tokenizer: Any
  eos_ids: tuple[int, ...]
  eos_id: int | None
  pad_id: int | None
  bos_id: int | None
  eos_token: str | None
  pad_token: str | None
  bos_token: str | None
  chat_template: str | None

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *,
                          add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """Renders `messages` with the checkpoint's Jinja chat template (needs jinja2)."""
    if self.chat_template is None:
      raise ValueError("This tokenizer has no chat_template in tokenizer_config.json.")
    import jinja2  # pylint: disable=g-import-not-at-top
    from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

    def raise_exception(message):
      raise jinja2.exceptions.TemplateError(message)

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(self.chat_template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt,
        eos_token=self.eos_token, bos_token=self.bos_token, pad_token=self.pad_token, **kwargs)


def _token_content(value: Any) -> str | None:
  """tokenizer_config.json stores special tokens as a string or as {"content": ...}."""
  if isinstance(value, dict):
    return value.get("content")
  return value


def load_hf_tokenizer(path: PathLike) -> HFTokenizer:
  """Loads ``tokenizer.json`` (+ ``tokenizer_config.json``, ``generation_config.json``)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(path)
  tok_file = path / "tokenizer.json"
  if not tok_file.exists():
    raise FileNotFoundError(f"No tokenizer.json in {path} (only fast tokenizers are supported).")
  tok = tokenizers.Tokenizer.from_file(str(tok_file))
  cfg_file = path / "tokenizer_config.json"
  cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
  gen_file = path / "generation_config.json"
  gen = json.loads(gen_file.read_text()) if gen_file.exists() else {}

  def token_id(name: str) -> tuple[str | None, int | None]:
    token = _token_content(cfg.get(name))
    if token is None:
      return None, None
    tid = tok.token_to_id(token)
    if tid is None:
      raise CheckpointError(f"{name}={token!r} in {cfg_file} is not in the vocabulary of {tok_file}.")
    return token, tid

  eos_token, eos_id = token_id("eos_token")
  pad_token, pad_id = token_id("pad_token")
  bos_token, bos_id = token_id("bos_token")
  gen_eos = gen.get("eos_token_id")
  gen_eos = [] if gen_eos is None else [gen_eos] if isinstance(gen_eos, int) else list(gen_eos)
  eos_ids = tuple(dict.fromkeys(([eos_id] if eos_id is not None else []) + gen_eos))
  if eos_id is None and eos_ids:
    eos_id = eos_ids[0]
  if pad_id is None:
    pad_id = eos_id
  template = cfg.get("chat_template")
  if template is None and (path / "chat_template.jinja").exists():
    template = (path / "chat_template.jinja").read_text()
  return HFTokenizer(tokenizer=tok, eos_ids=eos_ids, eos_id=eos_id, pad_id=pad_id, bos_id=bos_id,
                     eos_token=eos_token, pad_token=pad_token, bos_token=bos_token,
                     chat_template=template)
