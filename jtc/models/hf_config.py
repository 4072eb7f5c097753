"""Hugging Face ``config.json`` <-> jtc `ModelConfig`: which architectures load (Llama, Qwen2,
Qwen3, the mixtures of experts Qwen3-MoE and Qwen2-MoE, the hybrid Qwen3.5), their flags, RoPE
scaling and dtypes. The tensors themselves are `jtc.models.hf_tensors` / `hf_import`.

RoPE scaling: ``default``, ``linear`` and ``llama3`` (Llama-3.1/3.2), read from ``rope_scaling``
(transformers 4) or ``rope_parameters`` (transformers 5); a file with both that disagree is
rejected.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from jtc.models import model as model_lib
from jtc.models import model_config as model_config_lib

CONFIG_FILE = 'config.json'
# config.json "torch_dtype"/"dtype" value -> safetensors code.
HF_DTYPE_NAMES = {'float32': 'F32', 'float16': 'F16', 'bfloat16': 'BF16'}
# jtc dtype names (ModelConfig.param_dtype / dtype) -> numpy dtype.
JTC_DTYPES = {'float32': np.dtype(np.float32), 'bfloat16': np.dtype(ml_dtypes.bfloat16)}


class CheckpointError(ValueError):
  """A Hugging Face checkpoint directory that jtc cannot load as asked."""


# ----------------------------------------------------------------------------
# Architectures: config.json -> the two architecture flags of ModelConfig.
# ----------------------------------------------------------------------------


def _llama_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Llama's `attention_bias` also puts a bias on o_proj, which jtc has no slot for.
  _require_false(hf, 'attention_bias', 'LlamaForCausalLM')
  _require_false(hf, 'mlp_bias', 'LlamaForCausalLM')
  return dict(qk_norm=False, attn_bias=False)


def _qwen2_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Qwen2 always has biases on q/k/v (never on o_proj or the MLP).
  _require_false(hf, 'use_sliding_window', 'Qwen2ForCausalLM')
  return dict(qk_norm=False, attn_bias=True)


def _qwen3_flags(hf: Mapping[str, Any]) -> dict[str, bool]:
  # Qwen3's `attention_bias` would also put a bias on o_proj.
  _require_false(hf, 'attention_bias', 'Qwen3ForCausalLM')
  _require_false(hf, 'use_sliding_window', 'Qwen3ForCausalLM')
  return dict(qk_norm=True, attn_bias=False)


# Hugging Face's defaults for the Gated DeltaNet keys (`Qwen3_5TextConfig`) -> ModelConfig field.
_LINEAR_KEYS = {
    'linear_num_key_heads': ('linear_n_k_heads', 16),
    'linear_num_value_heads': ('linear_n_v_heads', 32),
    'linear_key_head_dim': ('linear_k_head_dim', 128),
    'linear_value_head_dim': ('linear_v_head_dim', 128),
    'linear_conv_kernel_dim': ('linear_conv_width', 4),
}


def _hybrid_layer_types(hf: Mapping[str, Any]) -> tuple:
  """``layer_types``, or (as Hugging Face) every ``full_attention_interval``-th layer full."""
  Y = int(hf['num_hidden_layers'])
  types = hf.get('layer_types')
  if types is None:
    interval = hf.get('full_attention_interval', 4)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
      raise CheckpointError(f'full_attention_interval={interval!r} in {CONFIG_FILE} must be a '
                            'positive int')
    types = ['linear_attention' if (i + 1) % interval else 'full_attention' for i in range(Y)]
  valid = model_config_lib.LAYER_TYPES
  bad = [t for t in types if t not in valid]
  if bad or len(types) != Y:
    raise CheckpointError(f'layer_types in {CONFIG_FILE} must name one of {list(valid)} per '
                          f'layer (num_hidden_layers={Y}); got {list(types)!r}')
  return tuple(types)


def _qwen3_5_flags(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Qwen3.5 (text): gated attention with qk-norm and partial RoPE, zero-centred norms, Gated
  DeltaNet in the layers `layer_types` says."""
  _require_false(hf, 'attention_bias', 'Qwen3_5ForCausalLM')
  rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
  factor = rope.get('partial_rotary_factor', hf.get('partial_rotary_factor', 0.25))
  linear = {field: int(hf.get(key, default)) for key, (field, default) in _LINEAR_KEYS.items()}
  return dict(qk_norm=True, attn_bias=False, attn_output_gate=True, norm_zero_centered=True,
              partial_rotary_factor=float(factor), layer_types=_hybrid_layer_types(hf), **linear)


def _moe_fields(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
  """The mixture-of-experts fields of `ModelConfig` (HF defaults where a key is absent:
  norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers []). Dense layers among sparse
  ones are rejected."""
  counts = {k: hf[k] for k in ('num_experts', 'num_local_experts') if hf.get(k) is not None}
  if len(set(counts.values())) > 1:
    raise CheckpointError(f'{CONFIG_FILE} has num_experts and num_local_experts that disagree: '
                          f'{counts}; keep one of them.')
  missing = [k for k in ('num_experts_per_tok', 'moe_intermediate_size') if k not in hf]
  if not counts or missing:
    raise CheckpointError(f'{arch} in {CONFIG_FILE} is missing keys '
                          f"{missing or ['num_experts']}.")
  n_experts = int(next(iter(counts.values())))
  step, dense = int(hf.get('decoder_sparse_step') or 1), list(hf.get('mlp_only_layers') or [])
  if n_experts <= 0 or step != 1 or dense:
    raise CheckpointError(
        f'{arch} with num_experts={n_experts}, decoder_sparse_step={step}, mlp_only_layers='
        f'{dense} in {CONFIG_FILE}: dense layers among sparse ones are not supported yet; '
        'supported: every layer sparse (num_experts > 0, decoder_sparse_step=1, '
        'mlp_only_layers=[]).')
  k = int(hf['num_experts_per_tok'])
  if not 1 <= k <= n_experts:
    raise CheckpointError(f'num_experts_per_tok={k} in {CONFIG_FILE} must be in [1, '
                          f'num_experts={n_experts}].')
  return dict(n_experts=n_experts, experts_per_token=k, d_expert=int(hf['moe_intermediate_size']),
              norm_topk_prob=bool(hf.get('norm_topk_prob', False)))


def _qwen3_moe_flags(hf: Mapping[str, Any]) -> dict[str, Any]:
  _require_false(hf, 'attention_bias', 'Qwen3MoeForCausalLM')
  _require_false(hf, 'use_sliding_window', 'Qwen3MoeForCausalLM')
  return dict(qk_norm=True, attn_bias=False, **_moe_fields(hf, 'Qwen3MoeForCausalLM'))


def _qwen2_moe_flags(hf: Mapping[str, Any]) -> dict[str, Any]:
  # Qwen2-MoE: q/k/v biases iff qkv_bias (default true), a shared expert behind a sigmoid gate.
  _require_false(hf, 'use_sliding_window', 'Qwen2MoeForCausalLM')
  shared = int(hf.get('shared_expert_intermediate_size') or 0)
  if shared <= 0:
    raise CheckpointError(f'Qwen2MoeForCausalLM needs shared_expert_intermediate_size > 0 in '
                          f'{CONFIG_FILE}, got {shared}.')
  return dict(qk_norm=False, attn_bias=bool(hf.get('qkv_bias', True)), d_shared_expert=shared,
              **_moe_fields(hf, 'Qwen2MoeForCausalLM'))


SUPPORTED_ARCHITECTURES: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    'LlamaForCausalLM': _llama_flags,
    'Qwen2ForCausalLM': _qwen2_flags,
    'Qwen3ForCausalLM': _qwen3_flags,
    'Qwen3_5ForCausalLM': _qwen3_5_flags,
    'Qwen3MoeForCausalLM': _qwen3_moe_flags,
    'Qwen2MoeForCausalLM': _qwen2_moe_flags,
}
_MODEL_TYPES = {
    'llama': 'LlamaForCausalLM',
    'qwen2': 'Qwen2ForCausalLM',
    'qwen3': 'Qwen3ForCausalLM',
    'qwen3_5_text': 'Qwen3_5ForCausalLM',
    'qwen3_moe': 'Qwen3MoeForCausalLM',
    'qwen2_moe': 'Qwen2MoeForCausalLM',
}

# Vision-language checkpoints whose text model jtc loads (the vision tower is skipped):
# architecture -> the tensor-name prefix of the language model.
LANGUAGE_MODELS = {'Qwen3_5ForConditionalGeneration': 'model.language_model.'}


def language_model(hf: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
  """(the text model's config.json keys, the prefix of its tensor names): a vision-language
  checkpoint's ``text_config`` as a `Qwen3_5ForCausalLM` config (the top level's embedding tie
  and dtype kept), else ``hf`` itself and 'model.'."""
  archs = hf.get('architectures') or []
  if len(archs) != 1 or archs[0] not in LANGUAGE_MODELS:
    return hf, 'model.'
  if not isinstance(hf.get('text_config'), Mapping):
    raise CheckpointError(f'{archs[0]} in {CONFIG_FILE} has no text_config.')
  text = dict(hf['text_config'], architectures=['Qwen3_5ForCausalLM'])
  for key in ('tie_word_embeddings', 'torch_dtype', 'dtype'):
    if key in hf:
      text[key] = hf[key]
  return text, LANGUAGE_MODELS[archs[0]]


def _require_false(hf: Mapping[str, Any], key: str, arch: str) -> None:
  if hf.get(key):
    raise CheckpointError(
        f'{arch} with {key}={hf[key]!r} in {CONFIG_FILE} is not supported by jtc.models.model '
        f'(only {key}=false).')


def _architecture(hf: Mapping[str, Any]) -> str:
  archs = hf.get('architectures') or []
  if not archs and hf.get('model_type') in _MODEL_TYPES:
    archs = [_MODEL_TYPES[hf['model_type']]]
  if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(
        f"Unsupported architecture {archs!r} (model_type={hf.get('model_type')!r}) in "
        f'{CONFIG_FILE}; supported: {sorted([*SUPPORTED_ARCHITECTURES, *LANGUAGE_MODELS])}.')
  return archs[0]


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
  flags = SUPPORTED_ARCHITECTURES[_architecture(hf)](hf)
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


def _is_qwen3_5(config: model_lib.ModelConfig) -> bool:
  c = config
  return 'linear_attention' in c.layer_types or c.attn_output_gate or c.norm_zero_centered


def architecture_for(config: model_lib.ModelConfig) -> str:
  """The HF architecture that represents `config` (used by the exporter)."""
  if _is_qwen3_5(config):
    c = config
    if c.is_moe:
      raise ValueError('A hybrid with a mixture of experts (Qwen3NextForCausalLM) does not export '
                       'yet; supported hybrids: Qwen3_5ForCausalLM (dense MLP)')
    if not (c.qk_norm and c.attn_output_gate and c.norm_zero_centered) or c.attn_bias:
      raise ValueError('A hybrid or gated-attention config exports as Qwen3_5ForCausalLM, which '
                       'has qk_norm, attn_output_gate and norm_zero_centered and no attn_bias; '
                       f'got qk_norm={c.qk_norm}, attn_output_gate={c.attn_output_gate}, '
                       f'norm_zero_centered={c.norm_zero_centered}, attn_bias={c.attn_bias}')
    return 'Qwen3_5ForCausalLM'
  if config.is_moe:
    if config.qk_norm and not config.attn_bias and not config.d_shared_expert:
      return 'Qwen3MoeForCausalLM'
    if not config.qk_norm and config.d_shared_expert:
      return 'Qwen2MoeForCausalLM'
    raise ValueError('No supported HF architecture has a mixture of experts with qk_norm='
                     f'{config.qk_norm}, attn_bias={config.attn_bias}, d_shared_expert='
                     f'{config.d_shared_expert} (Qwen3MoeForCausalLM: qk_norm, no bias, no shared '
                     'expert; Qwen2MoeForCausalLM: no qk_norm, a shared expert).')
  if config.qk_norm and config.attn_bias:
    raise ValueError('No supported HF architecture has both qk_norm and attn_bias '
                     f'(supported: {sorted(SUPPORTED_ARCHITECTURES)}).')
  if config.qk_norm:
    return 'Qwen3ForCausalLM'
  if config.attn_bias:
    return 'Qwen2ForCausalLM'
  return 'LlamaForCausalLM'


def hf_config_from(config: model_lib.ModelConfig, *,
                   torch_dtype: str = 'float32') -> dict[str, Any]:
  """Inverse of `config_from_hf`: a ``config.json`` dict for `config`."""
  arch = architecture_for(config)
  model_type = {v: k for k, v in _MODEL_TYPES.items()}[arch]
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
  if arch == 'Qwen3_5ForCausalLM':
    del hf['rope_theta'], hf['rope_scaling']
    hf['rope_parameters'] = dict(
        _rope_scaling_for_hf(config) or {'rope_type': 'default'}, rope_theta=config.rope_theta,
        partial_rotary_factor=config.partial_rotary_factor)
    hf['layer_types'] = list(config.layer_types or ['full_attention'] * config.n_layers)
    hf.update({key: getattr(config, field) for key, (field, _) in _LINEAR_KEYS.items()})
    hf.update(attention_bias=False)
    return hf
  if arch not in ('Qwen2ForCausalLM', 'Qwen2MoeForCausalLM'):
    hf.update(attention_bias=False)
  if arch == 'LlamaForCausalLM':
    hf.update(mlp_bias=False)
  else:
    hf.update(use_sliding_window=False, sliding_window=None)
  if config.is_moe:
    hf.update(num_experts=config.n_experts, num_experts_per_tok=config.experts_per_token,
              moe_intermediate_size=config.d_expert, norm_topk_prob=config.norm_topk_prob,
              decoder_sparse_step=1, mlp_only_layers=[])
  if arch == 'Qwen2MoeForCausalLM':
    hf.update(qkv_bias=config.attn_bias, shared_expert_intermediate_size=config.d_shared_expert)
  return hf
