"""Hugging Face checkpoints <-> jtc params, without torch.

Reads a Hugging Face model directory (``config.json`` plus one ``*.safetensors``
file or several shards listed in ``model.safetensors.index.json``) for the
architectures in ``SUPPORTED_ARCHITECTURES`` and returns a ``jtc.models.model.ModelConfig``
and a params pytree in the layout of ``jtc.models.model``. ``export_hf_checkpoint`` writes
the inverse, and ``load_hf_tokenizer`` reads ``tokenizer.json`` into the one
tokenizer class of jtc (`jtc.models.tokenizer.HFTokenizer`).

Safetensors files are read without torch by `jtc.models.safetensors_io` (memory-mapped,
bfloat16 through ``ml_dtypes``).

Layout map (HF ``nn.Linear`` weights are ``[out, in]``; jtc kernels are ``[in, ...out]``; jtc
stacks the layers, so layer i's tensor is row i of a ``layers/...`` array ``[Y, ...]``):

  model.embed_tokens.weight            [V, D]     -> embed/embedding              [V, D]
  model.layers.i.self_attn.q_proj.weight [N*H, D] -> layers/attn/q/kernel[i]      [D, N, H]
  model.layers.i.self_attn.q_proj.bias   [N*H]    -> layers/attn/q/bias[i]        [N, H]
  model.layers.i.self_attn.{k,v}_proj.weight [K*H, D] -> layers/attn/{k,v}/kernel[i] [D, K, H]
  model.layers.i.self_attn.o_proj.weight [D, N*H] -> layers/attn/o/kernel[i]      [N, H, D]
  model.layers.i.self_attn.{q,k}_norm.weight [H]  -> layers/attn/{q,k}_norm/scale[i] [H]
  model.layers.i.input_layernorm.weight  [D]      -> layers/attn_norm/scale[i]    [D]
  model.layers.i.post_attention_layernorm.weight -> layers/mlp_norm/scale[i]     [D]
  model.layers.i.mlp.{gate,up}_proj.weight [F, D] -> layers/mlp/{gate,up}/kernel[i] [D, F]
  model.layers.i.mlp.down_proj.weight    [D, F]   -> layers/mlp/down/kernel[i]    [F, D]
  mixture of experts (Qwen3-MoE, Qwen2-MoE; `jtc.models.moe`), expert e of layer i:
  model.layers.i.mlp.gate.weight         [X, D]   -> layers/mlp/router/kernel[i]  [D, X]
  ...mlp.experts.e.{gate,up}_proj.weight [F, D]   -> layers/mlp/expert_{gate,up}/kernel[i, e] [D, F]
  ...mlp.experts.e.down_proj.weight      [D, F]   -> layers/mlp/expert_down/kernel[i, e] [F, D]
  ...mlp.shared_expert.{gate,up,down}_proj.weight -> layers/mlp/shared/{gate,up,down}/kernel[i]
  ...mlp.shared_expert_gate.weight       [1, D]   -> layers/mlp/shared_gate/kernel[i] [D, 1]
  model.norm.weight                      [D]      -> final_norm/scale             [D]
  lm_head.weight                         [V, D]   -> lm_head/kernel               [D, V]

RoPE in jtc uses the same rotate-half convention as HF, so q/k need no permutation. RoPE
scaling: ``default``, ``linear`` and ``llama3`` (Llama-3.1/3.2), read from ``rope_scaling``
(transformers 4) or ``rope_parameters`` (transformers 5); a file with both that disagree is
rejected.

Dimension key (docs/dimensions.md): V vocab, D model dim, Y layers, N query heads, K kv heads, H head dim,
F mlp dim, X experts.
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
from jtc.models import lora
from jtc.models.hf_config import CONFIG_FILE, CheckpointError, config_from_hf, hf_config_from
from jtc.models import model as model_lib
from jtc.models import safetensors_io
from jtc.models import tokenizer as tokenizer_lib
# The safetensors reader, re-exported beside the checkpoint loader that uses it.
from jtc.models.safetensors_io import INDEX_FILE, read_safetensors_header, read_tensor

Params = dict[str, Any]
PathLike = str | os.PathLike

SINGLE_FILE = 'model.safetensors'

# ----------------------------------------------------------------------------
# Tensor name / layout mapping.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
  """One HF tensor and where it goes in the jtc params tree (row `layer` of a stacked
  ``layers/...`` array, or the whole array when `layer` is None; row [layer, expert] of a
  stacked [Y, X, ...] expert array when `expert` is set)."""
  hf_key: str
  jtc_path: tuple[str, ...]
  hf_shape: tuple[int, ...]
  to_jtc: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  layer: int | None = None
  expert: int | None = None

  @property
  def index(self) -> tuple[int, ...]:
    """Where the tensor sits in its jtc array: (), (layer,) or (layer, expert)."""
    return tuple(i for i in (self.layer, self.expert) if i is not None)


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
  specs = [_TensorSpec('model.embed_tokens.weight', ('embed', 'embedding'), (V, D), _same, _same)]
  for i in range(config.n_layers):
    hf = f'model.layers.{i}.'
    layer = lambda key, path, shape, to_jtc, to_hf: specs.append(
        _TensorSpec(hf + key, ('layers', *path), shape, to_jtc, to_hf, layer=i))
    for name, heads in [('q', N), ('k', K), ('v', K)]:
      layer(f'self_attn.{name}_proj.weight', ('attn', name, 'kernel'), (heads * H, D),
            *_in_proj(heads, H))
      if config.attn_bias:
        layer(f'self_attn.{name}_proj.bias', ('attn', name, 'bias'), (heads * H,),
              *_in_bias(heads, H))
    layer('self_attn.o_proj.weight', ('attn', 'o', 'kernel'), (D, N * H), *_out_proj(N, H))
    if config.qk_norm:
      for name in ('q_norm', 'k_norm'):
        layer(f'self_attn.{name}.weight', ('attn', name, 'scale'), (H,), _same, _same)
    if config.is_moe:
      specs.extend(_moe_specs(config, i))
    else:
      for name in ('gate', 'up'):
        layer(f'mlp.{name}_proj.weight', ('mlp', name, 'kernel'), (F, D), _transpose, _transpose)
      layer('mlp.down_proj.weight', ('mlp', 'down', 'kernel'), (D, F), _transpose, _transpose)
    layer('input_layernorm.weight', ('attn_norm', 'scale'), (D,), _same, _same)
    layer('post_attention_layernorm.weight', ('mlp_norm', 'scale'), (D,), _same, _same)
  specs.append(_TensorSpec('model.norm.weight', ('final_norm', 'scale'), (D,), _same, _same))
  if not config.tie_embeddings:
    specs.append(
        _TensorSpec('lm_head.weight', ('lm_head', 'kernel'), (V, D), _transpose, _transpose))
  return specs


def _moe_specs(config: model_lib.ModelConfig, i: int) -> list[_TensorSpec]:
  """Layer i's mixture-of-experts tensors: the router, every expert, the shared expert."""
  D, X, F, Fs = config.d_model, config.n_experts, config.d_expert, config.d_shared_expert
  hf, path = f'model.layers.{i}.mlp.', ('layers', 'mlp')
  specs = [
      _TensorSpec(hf + 'gate.weight', (*path, 'router', 'kernel'), (X, D), _transpose, _transpose,
                  layer=i)
  ]
  for e in range(X):
    for name, shape in (('gate', (F, D)), ('up', (F, D)), ('down', (D, F))):
      specs.append(
          _TensorSpec(f'{hf}experts.{e}.{name}_proj.weight', (*path, f'expert_{name}', 'kernel'),
                      shape, _transpose, _transpose, layer=i, expert=e))
  if Fs:
    for name, shape in (('gate', (Fs, D)), ('up', (Fs, D)), ('down', (D, Fs))):
      specs.append(
          _TensorSpec(f'{hf}shared_expert.{name}_proj.weight', (*path, 'shared', name, 'kernel'),
                      shape, _transpose, _transpose, layer=i))
    specs.append(
        _TensorSpec(hf + 'shared_expert_gate.weight', (*path, 'shared_gate', 'kernel'), (1, D),
                    _transpose, _transpose, layer=i))
  return specs


def _spec_name(spec: _TensorSpec) -> str:
  """'layers/attn/q/kernel[3]' or 'embed/embedding' (for error messages)."""
  return '/'.join(spec.jtc_path) + ''.join(f'[{i}]' for i in spec.index)


def _leading_shape(spec: _TensorSpec, config: model_lib.ModelConfig) -> tuple[int, ...]:
  """The stacked axes in front of the tensor in its jtc array: (), (Y,) or (Y, X)."""
  return (config.n_layers, config.n_experts)[:len(spec.index)]


# Tensors some checkpoints carry that carry no information for jtc.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)


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
  specs = tensor_specs(config)
  wanted = {s.hf_key for s in specs}
  unexpected = sorted(k for k in entries
                      if k not in wanted and not k.endswith(_IGNORED_SUFFIXES) and
                      not (config.tie_embeddings and k == 'lm_head.weight'))
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
    value = spec.to_jtc(read_tensor(entry, spec.hf_key)).astype(target)
    if spec.layer is None:
      _set_path(params, spec.jtc_path, value)
    else:  # row `index` of the stacked [Y(, X), ...] array, allocated when row 0 is read
      if not any(spec.index):
        _set_path(params, spec.jtc_path,
                  np.empty(_leading_shape(spec, config) + value.shape, target))
      _get_path(params, spec.jtc_path)[spec.index] = value
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
    if spec.jtc_path not in host:
      try:
        host[spec.jtc_path] = np.asarray(jax.device_get(_get_path(params, spec.jtc_path)))
      except KeyError as e:
        raise ValueError(
            f"params has no {'/'.join(spec.jtc_path)} (needed for {spec.hf_key}).") from e
    value = host[spec.jtc_path]
    if spec.layer is not None:
      lead = _leading_shape(spec, config)
      if value.shape[:len(lead)] != lead:
        raise ValueError(f"params/{'/'.join(spec.jtc_path)} has shape {list(value.shape)}; "
                         f'expected leading axes {list(lead)} (n_layers, n_experts).')
      value = value[spec.index]
    hf_value = np.ascontiguousarray(spec.to_hf(value).astype(np_dtype))
    if hf_value.shape != spec.hf_shape:
      raise ValueError(f'params/{_spec_name(spec)} has shape {list(value.shape)}, which '
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
