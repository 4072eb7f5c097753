"""Which tensors a Hugging Face checkpoint of a `ModelConfig` holds and where each goes in jtc's
parameters (`tensor_specs`); `jtc.models.hf_import` reads and writes the files.

Layout map (HF ``nn.Linear`` weights are ``[out, in]``; jtc kernels are ``[in, ...out]``; jtc
stacks the layers, so layer i's tensor is row i of a ``layers/...`` array ``[Y, ...]``; in a hybrid,
row j of a stack is the layer's row in it, `jtc.models.layer_types`):

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

Qwen3.5 (`Qwen3_5ForCausalLM`) adds its gated attention and Gated DeltaNet tensors:

  self_attn.q_proj.weight [N*2H, D] (per head: H query rows, then H gate rows)
                                     -> attn/q/kernel[j] [D, N, H], attn/q_gate/kernel[j]
  linear_attn.in_proj_qkv.weight [2KH + NHv, D]
                                     -> linear_attn/{q, k}/kernel[j] [D, K, H], v/kernel [D, N, Hv]
  linear_attn.conv1d.weight [2KH + NHv, 1, W]
                                     -> linear_attn/conv_{q, k}/kernel[j] [W, K, H], conv_v [W, N, Hv]
  linear_attn.in_proj_z.weight [NHv, D] -> linear_attn/z/kernel[j] [D, N, Hv]
  linear_attn.in_proj_{b, a}.weight [N, D] -> linear_attn/{beta, decay}/kernel[j] [D, N]
  linear_attn.A_log, dt_bias [N]     -> linear_attn/a_log[j], dt_bias[j]
  linear_attn.norm.weight [Hv]        -> linear_attn/norm/scale[j]
  linear_attn.out_proj.weight [D, NHv] -> linear_attn/o/kernel[j] [N, Hv, D]

Qwen3-Next (`Qwen3NextForCausalLM`, a mixture of experts in every layer) packs the same
projections per key head instead: ``in_proj_qkvz`` [K (2H + 2 Q Hv), D] (each key head's q, k,
then its Q value heads' v and z) and ``in_proj_ba`` [K 2Q, D] (`packed_qkvz`, `packed_ba`).

The zero-centred norms (``Qwen3_5RMSNorm``: y = norm(x) * (1 + w)) are stored as they are (w),
so an export round-trips exactly.

Dimension key (docs/dimensions.md): V vocab, D model dim, Y layers, N heads (attention: query
heads; Gated DeltaNet: value heads), K kv heads (Gated DeltaNet: key heads), H head dim (Gated
DeltaNet: key head dim, Hv its value head dim), F mlp dim, X experts.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jtc.models import layer_types
from jtc.models.model_config import ModelConfig


def _contiguous(x):
  return np.ascontiguousarray(x)


def gated_q_proj(n: int, h: int):
  """q_proj [n*2h, D] (HF, per head h query rows then h gate rows) <-> (q, q_gate) [D, n, h]."""

  def to_jtc(w):
    both = w.T.reshape(w.shape[1], n, 2 * h)
    return _contiguous(both[..., :h]), _contiguous(both[..., h:])

  def to_hf(q, gate):
    both = np.concatenate([q, gate], axis=-1)  # [D, n, 2h]
    return _contiguous(both.reshape(both.shape[0], n * 2 * h).T)

  return to_jtc, to_hf


def _split_rows(sizes):
  """Offsets of consecutive blocks of rows of the given sizes."""
  return np.cumsum([0, *sizes])


def packed_qkv(K: int, H: int, N: int, O: int):
  """in_proj_qkv [2KH + NO, D] <-> (q, k [D, K, H], v [D, N, O])."""
  cuts = _split_rows([K * H, K * H, N * O])

  def to_jtc(w):
    q, k, v = (_contiguous(w[cuts[i]:cuts[i + 1]].T) for i in range(3))
    return q.reshape(-1, K, H), k.reshape(-1, K, H), v.reshape(-1, N, O)

  def to_hf(q, k, v):
    flat = [x.reshape(x.shape[0], -1).T for x in (q, k, v)]
    return _contiguous(np.concatenate(flat, axis=0))

  return to_jtc, to_hf


def packed_conv(K: int, H: int, N: int, O: int, W: int):
  """conv1d.weight [2KH + NO, 1, W] <-> (conv_q, conv_k [W, K, H], conv_v [W, N, O])."""
  cuts = _split_rows([K * H, K * H, N * O])

  def to_jtc(w):
    parts = [w[cuts[i]:cuts[i + 1], 0].T for i in range(3)]  # [W, channels]
    return (_contiguous(parts[0]).reshape(W, K, H), _contiguous(parts[1]).reshape(W, K, H),
            _contiguous(parts[2]).reshape(W, N, O))

  def to_hf(q, k, v):
    flat = [x.reshape(W, -1).T for x in (q, k, v)]
    return _contiguous(np.concatenate(flat, axis=0)[:, None, :])

  return to_jtc, to_hf


def packed_qkvz(K: int, H: int, N: int, Hv: int):
  """Qwen3-Next's in_proj_qkvz [K (2H + 2 Q Hv), D], grouped by key head (each group: its q, k,
  then its Q value heads' v, then their z) <-> (q, k [D, K, H], v, z [D, N, Hv])."""
  Q = N // K
  cuts = _split_rows([H, H, Q * Hv, Q * Hv])

  def to_jtc(w):
    grouped = w.T.reshape(w.shape[1], K, 2 * H + 2 * Q * Hv)  # [D, K, group]
    q, k, v, z = (_contiguous(grouped[..., cuts[i]:cuts[i + 1]]) for i in range(4))
    return q, k, v.reshape(-1, N, Hv), z.reshape(-1, N, Hv)

  def to_hf(q, k, v, z):
    D = q.shape[0]
    grouped = np.concatenate([q, k, v.reshape(D, K, Q * Hv), z.reshape(D, K, Q * Hv)], axis=-1)
    return _contiguous(grouped.reshape(D, -1).T)

  return to_jtc, to_hf


def packed_ba(K: int, N: int):
  """Qwen3-Next's in_proj_ba [K 2Q, D], grouped by key head (its Q value heads' b, then their
  a) <-> (beta, decay [D, N])."""
  Q = N // K

  def to_jtc(w):
    grouped = w.T.reshape(w.shape[1], K, 2 * Q)
    return (_contiguous(grouped[..., :Q]).reshape(-1, N), _contiguous(grouped[...,
                                                                              Q:]).reshape(-1, N))

  def to_hf(beta, decay):
    D = beta.shape[0]
    grouped = np.concatenate([beta.reshape(D, K, Q), decay.reshape(D, K, Q)], axis=-1)
    return _contiguous(grouped.reshape(D, -1).T)

  return to_jtc, to_hf


def linear_attention_tensors(config: ModelConfig) -> list:
  """(HF name below ``linear_attn.``, jtc paths below 'linear_attn', HF shape, to_jtc, to_hf)
  of one Gated DeltaNet layer; several paths: to_jtc returns one array per path and to_hf takes
  them in that order."""
  c = config
  K, H, N, O, W = (c.linear_n_k_heads, c.linear_k_head_dim, c.linear_n_v_heads, c.linear_v_head_dim,
                   c.linear_conv_width)
  D, channels = c.d_model, 2 * K * H + N * O
  if config.is_moe:  # Qwen3-Next: q, k, v, z in one projection and b, a in another
    projections = [
        ('in_proj_qkvz.weight', (('q', 'kernel'), ('k', 'kernel'), ('v', 'kernel'),
                                 ('z', 'kernel')), (channels + N * O, D), *packed_qkvz(K, H, N, O)),
        ('in_proj_ba.weight', (('beta', 'kernel'), ('decay', 'kernel')), (2 * N, D),
         *packed_ba(K, N)),
    ]
  else:  # Qwen3.5
    projections = [
        ('in_proj_qkv.weight', (('q', 'kernel'), ('k', 'kernel'), ('v', 'kernel')), (channels, D),
         *packed_qkv(K, H, N, O)),
        ('in_proj_z.weight', (('z', 'kernel'),), (N * O, D), *_in_proj(N, O)),
        ('in_proj_b.weight', (('beta', 'kernel'),), (N, D), _transpose, _transpose),
        ('in_proj_a.weight', (('decay', 'kernel'),), (N, D), _transpose, _transpose),
    ]
  return projections + [
      ('conv1d.weight', (('conv_q', 'kernel'), ('conv_k', 'kernel'), ('conv_v', 'kernel')),
       (channels, 1, W), *packed_conv(K, H, N, O, W)),
      ('A_log', (('a_log',),), (N,), _same, _same),
      ('dt_bias', (('dt_bias',),), (N,), _same, _same),
      ('norm.weight', (('norm', 'scale'),), (O,), _same, _same),
      ('out_proj.weight', (('o', 'kernel'),), (D, N * O), *_out_proj(N, O)),
  ]


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
  """One HF tensor and where it goes in the jtc params tree (row `layer` of a stacked
  ``layers/...`` array of `rows` rows, or the whole array when `layer` is None; row [layer,
  expert] of a stacked [Y_s, X, ...] expert array when `expert` is set). A tensor that packs
  several jtc arrays (`parts`: their paths after `jtc_path`) has a `to_jtc` that returns one
  array per path and a `to_hf` that takes them in that order."""
  hf_key: str
  jtc_path: tuple[str, ...]
  hf_shape: tuple[int, ...]
  to_jtc: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  layer: int | None = None
  rows: int | None = None
  parts: tuple = ()
  expert: int | None = None
  n_experts: int | None = None

  @property
  def paths(self) -> tuple:
    return (self.jtc_path, *self.parts)

  @property
  def index(self) -> tuple[int, ...]:
    """Where the tensor sits in its jtc array: (), (row,) or (row, expert)."""
    return tuple(i for i in (self.layer, self.expert) if i is not None)

  @property
  def lead(self) -> tuple[int, ...]:
    """The stacked axes in front of the tensor in its jtc array: (), (Y_s,) or (Y_s, X)."""
    return (self.rows, self.n_experts)[:len(self.index)]


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


def tensor_specs(config: ModelConfig, prefix: str = 'model.') -> list[_TensorSpec]:
  """Every tensor a checkpoint of `config` must contain, in file order; the decoder's names
  start with ``prefix`` ('model.language_model.' in a vision-language checkpoint)."""
  V, D = config.vocab_size, config.d_model
  specs = [
      _TensorSpec(f'{prefix}embed_tokens.weight', ('embed', 'embedding'), (V, D), _same, _same)
  ]
  sizes = layer_types.stack_sizes(config)
  for i, (kind, rows) in enumerate(zip(layer_types.kinds(config), layer_types.rows(config))):
    hf = f'{prefix}layers.{i}.'

    def layer(key, path, shape, to_jtc, to_hf, parts=(), expert=None):
      stack = path[0]
      specs.append(
          _TensorSpec(hf + key, ('layers', *path), shape, to_jtc, to_hf, layer=rows[stack],
                      rows=sizes[stack], parts=tuple(('layers', stack, *p) for p in parts),
                      expert=expert, n_experts=None if expert is None else config.n_experts))

    if kind.mixer == 'linear_attention':
      for key, paths, shape, to_jtc, to_hf in linear_attention_tensors(config):
        layer(f'linear_attn.{key}', ('linear_attn', *paths[0]), shape, to_jtc, to_hf,
              parts=paths[1:])
    _attention_and_mlp(config, kind, layer)
  specs.append(_TensorSpec(f'{prefix}norm.weight', ('final_norm', 'scale'), (D,), _same, _same))
  if not config.tie_embeddings:
    specs.append(
        _TensorSpec('lm_head.weight', ('lm_head', 'kernel'), (V, D), _transpose, _transpose))
  return specs


def _attention_and_mlp(config, kind, layer):
  """The specs of a layer's full attention (if it has it), MLP and norms, through ``layer(hf
  name, jtc path below 'layers', HF shape, to_jtc, to_hf, parts=())``."""
  D, F = config.d_model, config.d_ff
  N, K, H = config.n_heads, config.n_kv_heads, config.head_dim
  if kind.mixer == 'full_attention':
    if config.attn_output_gate:
      layer('self_attn.q_proj.weight', ('attn', 'q', 'kernel'), (N * 2 * H, D), *gated_q_proj(N, H),
            parts=(('q_gate', 'kernel'),))
    for name, heads in [('q', N), ('k', K), ('v', K)]:
      if name == 'q' and config.attn_output_gate:
        continue
      layer(f'self_attn.{name}_proj.weight', ('attn', name, 'kernel'), (heads * H, D),
            *_in_proj(heads, H))
      if config.attn_bias:
        layer(f'self_attn.{name}_proj.bias', ('attn', name, 'bias'), (heads * H,),
              *_in_bias(heads, H))
    layer('self_attn.o_proj.weight', ('attn', 'o', 'kernel'), (D, N * H), *_out_proj(N, H))
    if config.qk_norm:
      for name in ('q_norm', 'k_norm'):
        layer(f'self_attn.{name}.weight', ('attn', name, 'scale'), (H,), _same, _same)
  if kind.ffn == 'moe':
    _moe(config, layer)
  else:
    for name in ('gate', 'up'):
      layer(f'mlp.{name}_proj.weight', ('mlp', name, 'kernel'), (F, D), _transpose, _transpose)
    layer('mlp.down_proj.weight', ('mlp', 'down', 'kernel'), (D, F), _transpose, _transpose)
  layer('input_layernorm.weight', ('attn_norm', 'scale'), (D,), _same, _same)
  layer('post_attention_layernorm.weight', ('mlp_norm', 'scale'), (D,), _same, _same)


def spec_name(spec: _TensorSpec) -> str:
  """'layers/attn/q/kernel[3]' or 'embed/embedding' (for error messages)."""
  return '/'.join(spec.jtc_path) + ''.join(f'[{i}]' for i in spec.index)


def _moe(config, layer):
  """A layer's mixture-of-experts tensors (`jtc.models.moe`): the router, every expert, the
  shared expert, through ``layer`` (as `_attention_and_mlp`)."""
  D, X, F, Fs = config.d_model, config.n_experts, config.d_expert, config.d_shared_expert
  layer('mlp.gate.weight', ('mlp', 'router', 'kernel'), (X, D), _transpose, _transpose)
  for e in range(X):
    for name, shape in (('gate', (F, D)), ('up', (F, D)), ('down', (D, F))):
      layer(f'mlp.experts.{e}.{name}_proj.weight', ('mlp', f'expert_{name}', 'kernel'), shape,
            _transpose, _transpose, expert=e)
  if Fs:
    for name, shape in (('gate', (Fs, D)), ('up', (Fs, D)), ('down', (D, Fs))):
      layer(f'mlp.shared_expert.{name}_proj.weight', ('mlp', 'shared', name, 'kernel'), shape,
            _transpose, _transpose)
    layer('mlp.shared_expert_gate.weight', ('mlp', 'shared_gate', 'kernel'), (1, D), _transpose,
          _transpose)
