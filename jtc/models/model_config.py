"""`ModelConfig`: the architecture of a Llama / Qwen2 / Qwen3 / Qwen3.5 decoder and its presets.

A frozen dataclass (hashable: static under jit) with classmethod presets
(`ModelConfig.tiny()`, `.qwen3_0_6b()`, `.qwen3_5_2b()`, ...); `jtc.models.model` is the network
it describes, `jtc.models.layer_types` the per-layer types of a hybrid.
"""

import dataclasses

import jax.numpy as jnp

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
ROPE_SCALINGS = ('default', 'linear', 'llama3')
# The trunk's causal attention (`jtc.models.attention`): the dense [L, S] scores, an online
# softmax over key blocks with a recomputing backward, or the Pallas TPU splash kernel.
ATTENTIONS = ('dense', 'blockwise', 'splash')
# A layer's token mixer (Hugging Face's `layer_types` values) and its feed-forward block: the
# kinds `jtc.models.layer_types` combines ('moe': `jtc.models.moe`, every layer's when
# n_experts > 0).
LAYER_TYPES = ('full_attention', 'linear_attention')
FFN_TYPES = ('mlp', 'moe')
# How a mixture-of-experts layer computes its experts (`jtc.models.moe.MOE_IMPLS`): all exact
# and dropless (every token reaches its experts), different in FLOPs and speed.
MOE_IMPLS = ('ragged', 'dense', 'blocks')
# How a mixture-of-experts layer meets a mesh's 'expert' axis (`jtc.models.moe_dispatch`): the
# tokens replicated along it, or split over it and exchanged with an all-to-all.
MOE_DISPATCHES = ('replicated', 'all_to_all')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters; `tiny()` is the default for a 2-core CPU."""
  vocab_size: int = 64
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 32
  d_ff: int = 384
  rope_theta: float = 10_000.0
  # RoPE frequency scaling (Hugging Face `rope_scaling` / `rope_parameters`):
  #   'default': angle_j = pos * theta^(-2j/H);
  #   'linear':  every frequency divided by rope_factor (positions interpolated);
  #   'llama3':  Llama-3.1/3.2: with wavelength w_j = 2 pi / f_j and
  #              s_j = clip((rope_original_max_len / w_j - low) / (high - low), 0, 1),
  #              f_j <- (1 - s_j) f_j / rope_factor + s_j f_j (low/high = rope_*_freq_factor):
  #              short wavelengths kept, long ones divided by the factor, a blend between.
  rope_scaling: str = 'default'
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  norm_eps: float = 1e-6
  qk_norm: bool = False
  attn_bias: bool = False
  tie_embeddings: bool = True
  param_dtype: str = 'float32'
  dtype: str = 'float32'
  max_seq_len: int = 2048
  # Rematerialise each block's activations in the backward pass (jax.checkpoint around the
  # scanned block): memory O(n_layers * B L D) instead of O(n_layers * B L (D + F + N S)),
  # for about one extra forward pass. Same parameters, same values, same gradients.
  remat: bool = False
  # How the trunk attends (`ATTENTIONS`): same values up to float rounding, different memory.
  attention: str = 'dense'
  # Per-layer types (`jtc.models.layer_types`): each layer's token mixer, 'full_attention' or
  # 'linear_attention' (Gated DeltaNet, `jtc.models.gated_deltanet`), as Hugging Face's
  # `layer_types`; and its feed-forward block (`FFN_TYPES`). () = every layer full attention
  # with the SwiGLU MLP (the dense models: their parameter layout is unchanged).
  layer_types: tuple = ()
  ffn_types: tuple = ()
  # Gated full attention (Qwen3.5, Qwen3-Next): out = o(attention * sigmoid(x W_g)), a gate per
  # head and dimension, W_g beside W_q ('q_gate').
  attn_output_gate: bool = False
  # RoPE on the first int(partial_rotary_factor * head_dim) dimensions of each head; the rest
  # pass through (Hugging Face `partial_rotary_factor`).
  partial_rotary_factor: float = 1.0
  # RMSNorm weights stored zero-centred, y = norm(x) * (1 + w) (Qwen3.5 / Qwen3-Next: the
  # layer, final and q/k norms; the Gated DeltaNet's output norm keeps y = norm(x) * w).
  norm_zero_centered: bool = False
  # Gated DeltaNet (the 'linear_attention' layers): K key heads, N = K * Q value heads (each with
  # its head dimension), a causal depthwise convolution of width `linear_conv_width` on q, k, v, and the
  # chunk length of the chunked parallel form (training and scoring; decoding is recurrent).
  linear_n_k_heads: int = 2
  linear_n_v_heads: int = 4
  linear_k_head_dim: int = 32
  linear_v_head_dim: int = 32
  linear_conv_width: int = 4
  linear_chunk: int = 64
  # Mixture of experts (`jtc.models.moe`, Qwen3-MoE): with n_experts > 0 every layer's MLP is
  # X = n_experts SwiGLU experts of width d_expert, experts_per_token of them per token (the top
  # of the router's softmax; their weights renormalised to sum 1 iff norm_topk_prob), plus a
  # shared expert of width d_shared_expert behind a sigmoid gate when that is > 0 (Qwen3-Next).
  # n_experts = 0: the dense SwiGLU MLP of width d_ff.
  n_experts: int = 0
  experts_per_token: int = 0
  d_expert: int = 0
  norm_topk_prob: bool = True
  d_shared_expert: int = 0
  moe_impl: str = 'ragged'
  moe_dispatch: str = 'replicated'

  def __post_init__(self):
    for name in ('layer_types', 'ffn_types'):  # a list from JSON or a config file: a tuple
      object.__setattr__(self, name, tuple(getattr(self, name)))
    for name in ('vocab_size', 'd_model', 'n_layers', 'n_heads', 'n_kv_heads', 'head_dim', 'd_ff',
                 'max_seq_len', 'rope_original_max_len', 'linear_n_k_heads', 'linear_n_v_heads',
                 'linear_k_head_dim', 'linear_v_head_dim', 'linear_conv_width', 'linear_chunk'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f'ModelConfig.{name} must be a positive int, got {value!r}')
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f'ModelConfig.n_heads={self.n_heads} must be divisible by '
                       f'ModelConfig.n_kv_heads={self.n_kv_heads}')
    if self.linear_n_v_heads % self.linear_n_k_heads:
      raise ValueError(f'ModelConfig.linear_n_v_heads={self.linear_n_v_heads} must be divisible '
                       f'by ModelConfig.linear_n_k_heads={self.linear_n_k_heads}')
    if self.head_dim % 2:
      raise ValueError(f'ModelConfig.head_dim={self.head_dim} must be even for RoPE')
    if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2 or not self.rotary_dim:
      raise ValueError(f'ModelConfig.partial_rotary_factor={self.partial_rotary_factor!r} must be '
                       f'in (0, 1] and rotate an even number of the head_dim={self.head_dim} '
                       f'dimensions (it rotates {self.rotary_dim})')
    if set(self.ffn_types) == {'mlp', 'moe'}:
      raise ValueError(f'ModelConfig.ffn_types={list(self.ffn_types)!r} mixes dense and '
                       "mixture-of-experts layers, which share the 'mlp' stack: not supported yet")
    if 'moe' in self.ffn_types and not self.n_experts:
      raise ValueError("ModelConfig.ffn_types has 'moe' layers but n_experts=0")
    if self.n_experts and 'mlp' in self.ffn_types:
      raise ValueError(f'ModelConfig.n_experts={self.n_experts} makes every layer a mixture of '
                       f"experts; ffn_types={list(self.ffn_types)!r} has 'mlp' layers")
    for name, valid in (('layer_types', LAYER_TYPES), ('ffn_types', FFN_TYPES)):
      values = getattr(self, name)
      if values and len(values) != self.n_layers:
        raise ValueError(f'ModelConfig.{name} has {len(values)} entries; it needs one per layer '
                         f'(n_layers={self.n_layers}) or none')
      for value in values:
        if value not in valid:
          raise ValueError(f'ModelConfig.{name}: unknown layer type {value!r}; valid: '
                           f'{list(valid)}')
    if not self.rope_theta > 0:
      raise ValueError(f'ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}')
    if self.rope_scaling not in ROPE_SCALINGS:
      raise ValueError(f'ModelConfig.rope_scaling={self.rope_scaling!r} is not one of '
                       f'{list(ROPE_SCALINGS)}')
    if not self.rope_factor > 0:
      raise ValueError(f'ModelConfig.rope_factor must be > 0, got {self.rope_factor!r}')
    if self.rope_scaling == 'llama3' and not (0 < self.rope_low_freq_factor <
                                              self.rope_high_freq_factor):
      raise ValueError('ModelConfig.rope_low_freq_factor and rope_high_freq_factor must satisfy '
                       f'0 < low < high for llama3 RoPE, got {self.rope_low_freq_factor!r}, '
                       f'{self.rope_high_freq_factor!r}')
    if not self.norm_eps > 0:
      raise ValueError(f'ModelConfig.norm_eps must be > 0, got {self.norm_eps!r}')
    if self.attention not in ATTENTIONS:
      raise ValueError(f'ModelConfig.attention={self.attention!r} is not one of {list(ATTENTIONS)}')
    for name in ('param_dtype', 'dtype'):
      value = getattr(self, name)
      if value not in DTYPES:
        raise ValueError(f'ModelConfig.{name}={value!r} is not one of {sorted(DTYPES)}')
    self._check_moe()
    for name in ('qk_norm', 'attn_bias', 'tie_embeddings', 'remat', 'attn_output_gate',
                 'norm_zero_centered', 'norm_topk_prob'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'ModelConfig.{name} must be a bool, got {getattr(self, name)!r}')

  def _check_moe(self):
    for name in ('n_experts', 'experts_per_token', 'd_expert', 'd_shared_expert'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f'ModelConfig.{name} must be an int >= 0, got {value!r}')
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f'ModelConfig.moe_impl={self.moe_impl!r} is not one of {list(MOE_IMPLS)}')
    if self.moe_dispatch not in MOE_DISPATCHES:
      raise ValueError(f'ModelConfig.moe_dispatch={self.moe_dispatch!r} is not one of '
                       f'{list(MOE_DISPATCHES)}')
    if not self.n_experts:
      return
    if not 1 <= self.experts_per_token <= self.n_experts:
      raise ValueError(f'ModelConfig.experts_per_token={self.experts_per_token} must be in '
                       f'[1, n_experts={self.n_experts}]')
    if not self.d_expert:
      raise ValueError(f'ModelConfig.d_expert must be > 0 with n_experts={self.n_experts}')

  @property
  def is_moe(self) -> bool:
    return self.n_experts > 0

  @property
  def rotary_dim(self) -> int:
    """The head dimensions RoPE rotates (the first ones): int(partial_rotary_factor * H)."""
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @classmethod
  def tiny(cls, vocab_size: int = 64, **overrides) -> 'ModelConfig':
    """About 0.8M parameters (+ V * 128): 4 layers, d_model 128, 4 heads, 2 kv heads."""
    return cls(
        **{
            **dict(vocab_size=vocab_size, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384, max_seq_len=2048),
            **overrides
        })

  @classmethod
  def small_25m(cls, **overrides) -> 'ModelConfig':
    """26.2M parameters (7 x 3.15M layers + tied 8192 x 512 embedding): the benchmark size."""
    return cls(
        **{
            **dict(vocab_size=8192, d_model=512, n_layers=7, n_heads=8, n_kv_heads=4, head_dim=64, d_ff=1536, max_seq_len=4096),
            **overrides
        })

  @classmethod
  def qwen3_0_6b(cls, **overrides) -> 'ModelConfig':
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_1_7b(cls, **overrides) -> 'ModelConfig':
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_8b(cls, **overrides) -> 'ModelConfig':
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=12_288, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_14b(cls, **overrides) -> 'ModelConfig':
    """Qwen/Qwen3-14B config.json: 40 layers, hidden 5120, 40 heads / 8 kv heads of 128,
    intermediate 17408, vocab 151936, rope_theta 1e6, untied embeddings."""
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8, head_dim=128, d_ff=17_408, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_32b(cls, **overrides) -> 'ModelConfig':
    """Qwen/Qwen3-32B config.json: 64 layers, hidden 5120, 64 heads / 8 kv heads of 128,
    intermediate 25600, vocab 151936, rope_theta 1e6, untied embeddings."""
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128, d_ff=25_600, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def llama3_1b(cls, **overrides) -> 'ModelConfig':
    """Llama-3.2-1B sizes, including its "llama3" RoPE frequency scaling (factor 32)."""
    return cls(
        **{
            **dict(vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192, rope_theta=500_000.0, rope_scaling='llama3', rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192, norm_eps=1e-5, qk_norm=False, attn_bias=False, tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=131_072),
            **overrides
        })

  @classmethod
  def tiny_hybrid(cls, vocab_size: int = 64, **overrides) -> 'ModelConfig':
    """The tiny CPU model as a Qwen3.5-style hybrid: 4 layers, three Gated DeltaNet (2 key / 4
    value heads of 32) then one gated full attention (partial RoPE, zero-centred norms); with
    n_layers overridden, every 4th layer full attention."""
    flags = _qwen3_5_flags(overrides.get('n_layers', 4))
    return cls.tiny(vocab_size, **{**flags, 'linear_chunk': 16, **overrides})

  @classmethod
  def qwen3_5_0_8b(cls, **overrides) -> 'ModelConfig':
    """Qwen3.5-0.8B's text model (Qwen/Qwen3.5-0.8B: 24 layers in 6 x (3 Gated DeltaNet, 1
    gated attention), hidden 1024, 8 heads / 2 kv heads of 256 (RoPE on 64), intermediate 3584;
    Gated DeltaNet 16 key / 16 value heads of 128; vocab 248320, rope_theta 1e7, tied)."""
    return cls(
        **{
            **dict(vocab_size=248_320, d_model=1024, n_layers=24, n_heads=8, n_kv_heads=2, head_dim=256, d_ff=3584, linear_n_k_heads=16, linear_n_v_heads=16, **_QWEN3_5, tie_embeddings=True),
            **_qwen3_5_flags(24),
            **overrides
        })

  @classmethod
  def qwen3_5_2b(cls, **overrides) -> 'ModelConfig':
    """Qwen3.5-2B's text model (24 layers as 0.8B, hidden 2048, 8 / 2 heads of 256,
    intermediate 6144; Gated DeltaNet 16 key / 16 value heads of 128; tied)."""
    return cls(
        **{
            **dict(vocab_size=248_320, d_model=2048, n_layers=24, n_heads=8, n_kv_heads=2, head_dim=256, d_ff=6144, linear_n_k_heads=16, linear_n_v_heads=16, **_QWEN3_5, tie_embeddings=True),
            **_qwen3_5_flags(24),
            **overrides
        })

  @classmethod
  def qwen3_5_9b(cls, **overrides) -> 'ModelConfig':
    """Qwen3.5-9B's text model (32 layers in 8 x (3 + 1), hidden 4096, 16 / 4 heads of 256,
    intermediate 12288; Gated DeltaNet 16 key / 32 value heads of 128; untied)."""
    return cls(
        **{
            **dict(vocab_size=248_320, d_model=4096, n_layers=32, n_heads=16, n_kv_heads=4, head_dim=256, d_ff=12_288, linear_n_k_heads=16, linear_n_v_heads=32, **_QWEN3_5, tie_embeddings=False),
            **_qwen3_5_flags(32),
            **overrides
        })

  @classmethod
  def tiny_moe(cls, vocab_size: int = 64, **overrides) -> 'ModelConfig':
    """`tiny` with a mixture of experts in every layer: 8 experts of width 192, 2 per token (the
    active MLP width 384 of `tiny`'s dense MLP), computed in blocks (the fast way on a CPU)."""
    return cls.tiny(
        vocab_size, **{
            **dict(n_experts=8, experts_per_token=2, d_expert=192, norm_topk_prob=True, moe_impl='blocks'),
            **overrides
        })

  @classmethod
  def qwen3_30b_a3b(cls, **overrides) -> 'ModelConfig':
    """Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 heads / 4 kv heads of 128,
    128 experts of intermediate 768, 8 per token (norm_topk_prob), dense intermediate 6144
    (unused: every layer is sparse), vocab 151936, rope_theta 1e6, untied embeddings."""
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, d_ff=6144, n_experts=128, experts_per_token=8, d_expert=768, norm_topk_prob=True, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_235b_a22b(cls, **overrides) -> 'ModelConfig':
    """Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads / 4 kv heads of 128,
    128 experts of intermediate 1536, 8 per token (norm_topk_prob), dense intermediate 12288
    (unused), vocab 151936, rope_theta 1e6, untied embeddings."""
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, d_ff=12_288, n_experts=128, experts_per_token=8, d_expert=1536, norm_topk_prob=True, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True, attn_bias=False, tie_embeddings=False, param_dtype='bfloat16', dtype='bfloat16', max_seq_len=40_960),
            **overrides
        })

  @classmethod
  def qwen3_next_80b_a3b(cls, **overrides) -> 'ModelConfig':
    """Qwen/Qwen3-Next-80B-A3B: 48 layers in 12 x (3 Gated DeltaNet, 1 gated attention), hidden
    2048, 16 heads / 2 kv heads of 256 (RoPE on 64); Gated DeltaNet 16 key / 32 value heads of
    128; in every layer 512 experts of intermediate 512, 10 per token (norm_topk_prob), a shared
    expert of 512 behind a sigmoid gate; vocab 151936, rope_theta 1e7, untied."""
    return cls(
        **{
            **dict(vocab_size=151_936, d_model=2048, n_layers=48, n_heads=16, n_kv_heads=2, head_dim=256, d_ff=5120, linear_n_k_heads=16, linear_n_v_heads=32, n_experts=512, experts_per_token=10, d_expert=512, d_shared_expert=512, norm_topk_prob=True, **_QWEN3_5, tie_embeddings=False),
            **_qwen3_5_flags(48),
            **overrides
        })


# What every Qwen3.5 / Qwen3-Next text model shares (Hugging Face `Qwen3_5TextConfig`, the published configs).
_QWEN3_5 = dict(rope_theta=10_000_000.0, norm_eps=1e-6, linear_k_head_dim=128,
                linear_v_head_dim=128, linear_conv_width=4, param_dtype='bfloat16',
                dtype='bfloat16', max_seq_len=262_144)


def _qwen3_5_flags(n_layers: int) -> dict:
  """Qwen3.5's architecture flags for ``n_layers`` layers: every 4th layer full attention (with
  an output gate, qk-norm and RoPE on a quarter of each head), the others Gated DeltaNet."""
  types = tuple(
      'full_attention' if (i + 1) % 4 == 0 else 'linear_attention' for i in range(n_layers))
  return dict(layer_types=types, attn_output_gate=True, qk_norm=True, partial_rotary_factor=0.25,
              norm_zero_centered=True)
