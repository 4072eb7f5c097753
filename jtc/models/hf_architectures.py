"""Which Hugging Face architectures jtc loads and what each means for `ModelConfig`: the flags of
Llama, Qwen2, Qwen3, the mixtures of experts Qwen3-MoE / Qwen2-MoE and the hybrids Qwen3.5 /
Qwen3-Next (Gated DeltaNet + gated attention), read from ``config.json``; the architecture that
represents a config on export. `jtc.models.hf_config` turns a whole ``config.json`` into a
`ModelConfig` and back (RoPE scaling, dtypes), `jtc.models.hf_tensors` maps the tensors.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from jtc.models import model_config as model_config_lib

CONFIG_FILE = 'config.json'


# config.json "torch_dtype"/"dtype" value -> safetensors code.
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
LINEAR_KEYS = {
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


def _hybrid_fields(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
  """The hybrids' attention (gated, qk-norm, partial RoPE, zero-centred norms) and Gated
  DeltaNet in the layers `layer_types` says."""
  _require_false(hf, 'attention_bias', arch)
  rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
  factor = rope.get('partial_rotary_factor', hf.get('partial_rotary_factor', 0.25))
  linear = {field: int(hf.get(key, default)) for key, (field, default) in LINEAR_KEYS.items()}
  return dict(qk_norm=True, attn_bias=False, attn_output_gate=True, norm_zero_centered=True,
              partial_rotary_factor=float(factor), layer_types=_hybrid_layer_types(hf), **linear)


def _qwen3_5_flags(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Qwen3.5 (text): the hybrid with a dense SwiGLU MLP in every layer."""
  return _hybrid_fields(hf, 'Qwen3_5ForCausalLM')


def _qwen3_next_flags(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Qwen3-Next: the hybrid with a mixture of experts and its gated shared expert in every
  layer (`jtc.models.moe`)."""
  shared = int(hf.get('shared_expert_intermediate_size') or 0)
  if shared <= 0:
    raise CheckpointError(f'Qwen3NextForCausalLM needs shared_expert_intermediate_size > 0 in '
                          f'{CONFIG_FILE}, got {shared}.')
  return dict(_hybrid_fields(hf, 'Qwen3NextForCausalLM'), d_shared_expert=shared,
              **_moe_fields(hf, 'Qwen3NextForCausalLM'))


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
    'Qwen3NextForCausalLM': _qwen3_next_flags,
    'Qwen3MoeForCausalLM': _qwen3_moe_flags,
    'Qwen2MoeForCausalLM': _qwen2_moe_flags,
}
MODEL_TYPES = {
    'llama': 'LlamaForCausalLM',
    'qwen2': 'Qwen2ForCausalLM',
    'qwen3': 'Qwen3ForCausalLM',
    'qwen3_5_text': 'Qwen3_5ForCausalLM',
    'qwen3_next': 'Qwen3NextForCausalLM',
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


def architecture(hf: Mapping[str, Any]) -> str:
  archs = hf.get('architectures') or []
  if not archs and hf.get('model_type') in MODEL_TYPES:
    archs = [MODEL_TYPES[hf['model_type']]]
  if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(
        f"Unsupported architecture {archs!r} (model_type={hf.get('model_type')!r}) in "
        f'{CONFIG_FILE}; supported: {sorted([*SUPPORTED_ARCHITECTURES, *LANGUAGE_MODELS])}.')
  return archs[0]


def is_hybrid_architecture(config: model_config_lib.ModelConfig) -> bool:
  """Whether ``config`` is one of the hybrids (Qwen3.5, Qwen3-Next)."""
  c = config
  return 'linear_attention' in c.layer_types or c.attn_output_gate or c.norm_zero_centered


def architecture_for(config: model_config_lib.ModelConfig) -> str:
  """The HF architecture that represents `config` (used by the exporter)."""
  if is_hybrid_architecture(config):
    c = config
    if not (c.qk_norm and c.attn_output_gate and c.norm_zero_centered) or c.attn_bias:
      raise ValueError('A hybrid or gated-attention config exports as Qwen3_5ForCausalLM or '
                       'Qwen3NextForCausalLM, which have qk_norm, attn_output_gate and '
                       f'norm_zero_centered and no attn_bias; got qk_norm={c.qk_norm}, '
                       f'attn_output_gate={c.attn_output_gate}, norm_zero_centered='
                       f'{c.norm_zero_centered}, attn_bias={c.attn_bias}')
    if c.is_moe and not c.d_shared_expert:
      raise ValueError('Qwen3NextForCausalLM has a shared expert in every layer; this config has '
                       'd_shared_expert=0')
    return 'Qwen3NextForCausalLM' if c.is_moe else 'Qwen3_5ForCausalLM'
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
