"""Hugging Face ``config.json`` <-> jtc `ModelConfig`: the sizes, RoPE scaling and dtypes, with the
architecture's flags from `jtc.models.hf_architectures` (which architectures load: Llama, Qwen2,
Qwen3, Qwen3-MoE, Qwen2-MoE, Qwen3.5, Qwen3-Next). The tensors themselves are
`jtc.models.hf_tensors` / `hf_import`.

RoPE scaling: ``default``, ``linear`` and ``llama3`` (Llama-3.1/3.2), read from ``rope_scaling``
(transformers 4) or ``rope_parameters`` (transformers 5); a file with both that disagree is
rejected.
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_dtypes
import numpy as np

from jtc.models import model as model_lib
# The architectures and their flags (re-exported: the errors and names every loader uses).
from jtc.models.hf_architectures import (CONFIG_FILE, LINEAR_KEYS, MODEL_TYPES,
                                         SUPPORTED_ARCHITECTURES, CheckpointError, architecture,
                                         architecture_for, is_hybrid_architecture, language_model)

HF_DTYPE_NAMES = {'float32': 'F32', 'float16': 'F16', 'bfloat16': 'BF16'}
# jtc dtype names (ModelConfig.param_dtype / dtype) -> numpy dtype.
JTC_DTYPES = {'float32': np.dtype(np.float32), 'bfloat16': np.dtype(ml_dtypes.bfloat16)}


_ROPE_KEYS = {  # HF key -> ModelConfig field, per rope_type
    'linear': {'factor': 'rope_factor'},
    'llama3': {'factor': 'rope_factor', 'low_freq_factor': 'rope_low_freq_factor',
               'high_freq_factor': 'rope_high_freq_factor',
               'original_max_position_embeddings': 'rope_original_max_len'},
}


def _rope_type(rope: Mapping[str, Any]) -> str:
  return rope.get('rope_type', rope.get('type', 'default'))


def _rope_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """ModelConfig RoPE fields from ``rope_theta`` + ``rope_scaling`` (transformers 4) or
  ``rope_parameters`` (transformers 5, theta inside); both may be present only if they agree."""
  params = hf.get('rope_parameters') or {}
  scaling = hf.get('rope_scaling') or {}
  if params and scaling:
    keys = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')
    a = (_rope_type(params), *(params.get(k) for k in keys))
    b = (_rope_type(scaling), *(scaling.get(k) for k in keys))
    if a != b:
      raise CheckpointError(f'{CONFIG_FILE} has both rope_parameters={dict(params)!r} and '
                            f'rope_scaling={dict(scaling)!r}, and they disagree; keep one of them.')
  rope = params or scaling
  theta_top, theta_in = hf.get('rope_theta'), rope.get('rope_theta')
  if theta_top is not None and theta_in is not None and float(theta_top) != float(theta_in):
    raise CheckpointError(f'{CONFIG_FILE} has rope_theta={theta_top!r} but rope_parameters.'
                          f'rope_theta={theta_in!r}; keep one of them.')
  theta = theta_top if theta_top is not None else theta_in
  if theta is None:
    raise CheckpointError(
        f"{CONFIG_FILE} has neither 'rope_theta' nor 'rope_parameters.rope_theta'.")
  rope_type = _rope_type(rope)
  supported = ['default', *_ROPE_KEYS]
  if rope_type not in supported:
    raise CheckpointError(
        f'RoPE scaling rope_type={rope_type!r} in {CONFIG_FILE} is not supported by '
        f'jtc.models.model; supported: {supported}.')
  fields: dict[str, Any] = dict(rope_theta=float(theta), rope_scaling=rope_type)
  for key, field in _ROPE_KEYS.get(rope_type, {}).items():
    if rope.get(key) is None:
      raise CheckpointError(f'RoPE scaling rope_type={rope_type!r} in {CONFIG_FILE} needs '
                            f'{key!r}; it has {sorted(rope)}.')
    fields[field] = int(rope[key]) if field == 'rope_original_max_len' else float(rope[key])
  return fields


def _rope_scaling_for_hf(config: model_lib.ModelConfig) -> dict[str, Any] | None:
  """Inverse of `_rope_fields` (the ``rope_scaling`` dict, None for plain RoPE)."""
  if config.rope_scaling == 'default':
    return None
  out: dict[str, Any] = {'rope_type': config.rope_scaling}
  for key, field in _ROPE_KEYS[config.rope_scaling].items():
    out[key] = getattr(config, field)
  return out


def _hf_dtype_code(hf: Mapping[str, Any]) -> str | None:
  name = hf.get('torch_dtype', hf.get('dtype'))
  if name is None:
    return None
  if name not in HF_DTYPE_NAMES:
    raise CheckpointError(
        f'Unsupported dtype {name!r} in {CONFIG_FILE}; supported: {sorted(HF_DTYPE_NAMES)}.')
  return HF_DTYPE_NAMES[name]


def _check_jtc_dtype(name: str, what: str) -> str:
  if name not in JTC_DTYPES:
    raise ValueError(f'Unsupported {what}={name!r}; valid: {sorted(JTC_DTYPES)}.')
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
  hf, _ = language_model(hf_config)
  flags = SUPPORTED_ARCHITECTURES[architecture(hf)](hf)
  act = hf.get('hidden_act', 'silu')
  if act not in ('silu', 'swish'):
    raise CheckpointError(
        f"hidden_act={act!r} in {CONFIG_FILE} is not supported; supported: ['silu'].")
  required = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
              'num_attention_heads', 'rms_norm_eps')
  missing = [k for k in required if k not in hf]
  if missing:
    raise CheckpointError(f'{CONFIG_FILE} is missing keys {missing}.')
  n_heads = int(hf['num_attention_heads'])
  head_dim = hf.get('head_dim') or hf['hidden_size'] // n_heads
  if param_dtype is None:
    param_dtype = 'bfloat16' if _hf_dtype_code(hf) == 'BF16' else 'float32'
  _check_jtc_dtype(param_dtype, 'param_dtype')
  dtype = _check_jtc_dtype(dtype or param_dtype, 'dtype')
  return model_lib.ModelConfig(
      vocab_size=int(hf['vocab_size']),
      d_model=int(hf['hidden_size']),
      n_layers=int(hf['num_hidden_layers']),
      n_heads=n_heads,
      n_kv_heads=int(hf.get('num_key_value_heads') or n_heads),
      head_dim=int(head_dim),
      d_ff=int(hf['intermediate_size']),
      **_rope_fields(hf),
      norm_eps=float(hf['rms_norm_eps']),
      **flags,
      tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
      param_dtype=param_dtype,
      dtype=dtype,
      max_seq_len=int(max_seq_len or hf.get('max_position_embeddings', 4096)),
  )


def hf_config_from(config: model_lib.ModelConfig, *,
                   torch_dtype: str = 'float32') -> dict[str, Any]:
  """Inverse of `config_from_hf`: a ``config.json`` dict for `config`."""
  arch = architecture_for(config)
  model_type = {v: k for k, v in MODEL_TYPES.items()}[arch]
  hf: dict[str, Any] = dict(
      architectures=[arch],
      model_type=model_type,
      vocab_size=config.vocab_size,
      hidden_size=config.d_model,
      intermediate_size=config.d_ff,
      num_hidden_layers=config.n_layers,
      num_attention_heads=config.n_heads,
      num_key_value_heads=config.n_kv_heads,
      head_dim=config.head_dim,
      hidden_act='silu',
      max_position_embeddings=config.max_seq_len,
      rms_norm_eps=config.norm_eps,
      rope_theta=config.rope_theta,
      rope_scaling=_rope_scaling_for_hf(config),
      tie_word_embeddings=config.tie_embeddings,
      torch_dtype=torch_dtype,
      use_cache=True,
      bos_token_id=None,
      eos_token_id=None,
      pad_token_id=None,
  )
  if is_hybrid_architecture(config):
    del hf['rope_theta'], hf['rope_scaling']
    hf['rope_parameters'] = dict(
        _rope_scaling_for_hf(config) or {'rope_type': 'default'}, rope_theta=config.rope_theta,
        partial_rotary_factor=config.partial_rotary_factor)
    hf['layer_types'] = list(config.layer_types or ['full_attention'] * config.n_layers)
    hf.update({key: getattr(config, field) for key, (field, _) in LINEAR_KEYS.items()})
  elif arch not in ('Qwen2ForCausalLM', 'Qwen2MoeForCausalLM'):
    hf.update(attention_bias=False)
  if arch == 'LlamaForCausalLM':
    hf.update(mlp_bias=False)
  elif not is_hybrid_architecture(config):
    hf.update(use_sliding_window=False, sliding_window=None)
  if config.is_moe:
    hf.update(num_experts=config.n_experts, num_experts_per_tok=config.experts_per_token,
              moe_intermediate_size=config.d_expert, norm_topk_prob=config.norm_topk_prob,
              decoder_sparse_step=1, mlp_only_layers=[])
  if arch == 'Qwen2MoeForCausalLM':
    hf.update(qkv_bias=config.attn_bias)
  if config.d_shared_expert:
    hf.update(shared_expert_intermediate_size=config.d_shared_expert)
  if is_hybrid_architecture(config):
    hf.update(attention_bias=False)
  return hf
