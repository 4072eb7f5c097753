"""Low-rank adapters (LoRA, Hu et al. 2021) on a frozen base: W x + (alpha / r) B(A(x)).

A target projection with kernel W [in..., out...] gets A [in..., r] (drawn N(0, 1/fan_in)) and
B [r, out...] (zeros, so the adapted policy starts exactly at the base). The adapters mirror the
parameter layout of `jtc.models.model` under 'layers', stacked on the layer axis Y like the
other parameters, so the trunk's scan carries them::

  {'layers': {'attn': {'q': {'lora_a': [Y, D, r], 'lora_b': [Y, r, N, H]}, ...},
              'mlp': {'gate': {'lora_a': [Y, D, r], 'lora_b': [Y, r, F]}, ...}}}

`Adapted(base, adapters, scale)` is the policy the model reads: a mapping that presents the base
parameters with each target's ``lora_a`` and ``scale * lora_b`` beside its kernel, which
`jtc.models.layers.dense` applies as the batched low-rank product ``x W + (x A) (s B)`` (the base
weights are read once, never merged). The base is behind ``jax.lax.stop_gradient`` there: it is
frozen, so any gradient taken through an `Adapted` is an adapter gradient. ``adapters=None`` is
the base alone (the KL reference policy of a LoRA run, free). Under a population's vmap the base
is shared (`member_in_axes`: in_axes None) and only the adapters carry the member axis.

`merge` folds the adapters into the kernels (W + s A B: a plain parameter tree, e.g. for
`jtc.models.hf_import.export_hf_checkpoint`).

In a hybrid the q / k / v / o targets also adapt the Gated DeltaNet layers' projections
(``'linear_attn'``, stacked over those layers only: `LINEAR_TARGETS`).

Dimension key (docs/dimensions.md): Y layers, D model dim, N heads, H head dim, F mlp dim, r rank.
"""

import collections.abc
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import layer_types

# Target name -> (its path under params['layers'], the number of input axes of its kernel).
TARGETS = {
    'q': (('attn', 'q'), 1),
    'k': (('attn', 'k'), 1),
    'v': (('attn', 'v'), 1),
    'o': (('attn', 'o'), 2),
    'gate': (('mlp', 'gate'), 1),
    'up': (('mlp', 'up'), 1),
    'down': (('mlp', 'down'), 1),
}
ADAPTER_KEYS = ('lora_a', 'lora_b')
# In a hybrid (`jtc.models.layer_types`) the q / k / v / o targets also adapt the Gated DeltaNet
# layers' projections of the same name (their own stack, 'linear_attn').
LINEAR_TARGETS = {
    'q': (('linear_attn', 'q'), 1),
    'k': (('linear_attn', 'k'), 1),
    'v': (('linear_attn', 'v'), 1),
    'o': (('linear_attn', 'o'), 2),
}
INIT_SEED = 0  # A's PRNG key: the same for every seed and member, like the base weights


def parse_targets(text) -> tuple:
  """'q,v' -> ('q', 'v'); a ValueError naming an unknown or repeated target and the valid ones."""
  names = tuple(t.strip() for t in str(text).split(',') if t.strip())
  if not names:
    raise ValueError(f'config.lora.targets={text!r} names no target; valid: {list(TARGETS)}')
  for name in names:
    if name not in TARGETS:
      raise ValueError(f'config.lora.targets: unknown target {name!r}; valid: {list(TARGETS)}')
  if len(set(names)) != len(names):
    raise ValueError(f'config.lora.targets={text!r} repeats a target')
  return names


def scale(lora) -> float:
  """alpha / rank of a config's `lora` section."""
  return float(lora.alpha) / lora.rank


def _paths(model_config, name) -> list:
  """The (group, proj) paths under params['layers'] target ``name`` adapts in this model."""
  sizes = layer_types.stack_sizes(model_config)
  paths = [TARGETS[name][0]] + ([LINEAR_TARGETS[name][0]] if name in LINEAR_TARGETS else [])
  return [path for path in paths if path[0] in sizes]


def _kernel_dims(model_config, name, group='attn'):
  """(input dims, output dims) of target ``name``'s kernel (no layer axis) in stack ``group``."""
  c = model_config
  D, N, K, H, F = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
  if group == 'linear_attn':
    K, H, N, O = c.linear_n_k_heads, c.linear_k_head_dim, c.linear_n_v_heads, c.linear_v_head_dim
    return {
        'q': ((D,), (K, H)),
        'k': ((D,), (K, H)),
        'v': ((D,), (N, O)),
        'o': ((N, O), (D,))
    }[name]
  shapes = {
      'q': ((D,), (N, H)),
      'k': ((D,), (K, H)),
      'v': ((D,), (K, H)),
      'o': ((N, H), (D,)),
      'gate': ((D,), (F,)),
      'up': ((D,), (F,)),
      'down': ((F,), (D,))
  }
  return shapes[name]


def check_config(lora, model_config=None):
  """A config's `lora` section, before any compute (``model_config``: also the rank against
  every target's dimensions). Rank 0 (full fine-tuning) accepts any other setting."""
  rank = lora.rank
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
    raise ValueError(f'config.lora.rank={rank!r} must be an int >= 0 (0 = full fine-tuning)')
  if rank == 0:
    return
  if isinstance(lora.alpha, bool) or not isinstance(lora.alpha, (int, float)) or lora.alpha <= 0:
    raise ValueError(f'config.lora.alpha={lora.alpha!r} must be > 0 (the adapters are scaled by '
                     'alpha / rank)')
  for name in parse_targets(lora.targets):
    for group, _ in ([] if model_config is None else _paths(model_config, name)):
      dims_in, dims_out = _kernel_dims(model_config, name, group)
      most = min(math.prod(dims_in), math.prod(dims_out))
      if rank <= most:
        continue
      raise ValueError(f'config.lora.rank={rank} exceeds target {name!r} ({group}): its kernel '
                       f'maps {math.prod(dims_in)} to {math.prod(dims_out)} features, so the '
                       f'rank can be at most {most}')


def init_adapters(model_config, *, rank: int, targets, rng=None) -> dict:
  """Adapters of ``targets`` (names of `TARGETS`): A [Y, in..., r] ~ N(0, 1/fan_in), B = 0,
  in the parameter dtype; ``rng`` defaults to key(`INIT_SEED`)."""
  rng = jax.random.key(INIT_SEED) if rng is None else rng
  sizes, dtype = layer_types.stack_sizes(model_config), model_config.jnp_param_dtype
  out = {}
  for name in targets:
    for group, proj in _paths(model_config, name):
      Y = sizes[group]
      dims_in, dims_out = _kernel_dims(model_config, name, group)
      key = jax.random.fold_in(rng, list(TARGETS).index(name))
      if group != TARGETS[name][0][0]:
        key = jax.random.fold_in(key, 1)
      a = jax.random.normal(key, (Y, *dims_in, rank), jnp.float32) / math.sqrt(math.prod(dims_in))
      out.setdefault(group, {})[proj] = {
          'lora_a': a.astype(dtype),
          'lora_b': jnp.zeros((Y, rank, *dims_out), dtype)
      }
  return {'layers': out}


def _targets_of(adapters):
  """[(group, proj)] of the projections an adapter tree adapts."""
  return [(g, p) for g, projs in adapters['layers'].items() for p in projs]


@flax.struct.dataclass
class Adapted(collections.abc.Mapping):
  """The policy of a LoRA run: the frozen ``base`` parameters with ``adapters`` (or None: the
  base alone), read as the parameter mapping of `jtc.models.model` (see the module doc)."""
  base: dict
  adapters: dict | None
  scale: float = flax.struct.field(pytree_node=False, default=1.0)

  def view(self) -> dict:
    """The parameter dict the model reads: base (gradient stopped) + lora_a, scale * lora_b."""
    # The base is frozen: a gradient through the policy is an adapter gradient.
    base = jax.tree.map(jax.lax.stop_gradient, self.base)
    if self.adapters is None:
      return base
    layers = {g: dict(v) for g, v in base['layers'].items()}
    for group, proj in _targets_of(self.adapters):
      adapter = self.adapters['layers'][group][proj]
      layers[group][proj] = dict(layers[group][proj], lora_a=adapter['lora_a'],
                                 lora_b=adapter['lora_b'] * self.scale)
    return dict(base, layers=layers)

  def merged(self) -> dict:
    """`merge` of this policy: plain parameters (the base itself without adapters)."""
    return self.base if self.adapters is None else merge(self.base, self.adapters, self.scale)

  def __getitem__(self, key):
    return self.view()[key]

  def __iter__(self):
    return iter(self.base)

  def __len__(self):
    return len(self.base)


def low_rank(eqn: str, x, p, dtype):
  """The adapter term (x A) B of `layers.dense`'s ``einsum(eqn, x, kernel)``: the kernel's
  input letters are contracted with A [in..., r], then r with B [r, out...]."""
  x_term, rest = eqn.split(',')
  w_term, y_term = rest.split('->')
  n_in = p['lora_a'].ndim - 1
  w_in, w_out = w_term[:n_in], w_term[n_in:]
  kept = ''.join(ch for ch in x_term if ch not in w_in)
  h = jnp.einsum(f'{x_term},{w_in}r->{kept}r', x.astype(dtype), p['lora_a'].astype(dtype))
  return jnp.einsum(f'{kept}r,r{w_out}->{y_term}', h, p['lora_b'].astype(dtype))


def merge(base, adapters, scale_: float) -> dict:
  """Plain parameters with every adapted kernel W replaced by W + scale * A B (float32 sum, cast
  to W's dtype): the adapted policy without adapters."""
  layers = {g: dict(v) for g, v in base['layers'].items()}
  for group, proj in _targets_of(adapters):
    a, b = adapters['layers'][group][proj]['lora_a'], adapters['layers'][group][proj]['lora_b']
    w = layers[group][proj]['kernel']
    n_in, n_out = a.ndim - 2, b.ndim - 2
    ins, outs = 'abcd'[:n_in], 'efgh'[:n_out]
    ab = jnp.einsum(f'Y{ins}r,Yr{outs}->Y{ins}{outs}', jnp.asarray(a, jnp.float32),
                    jnp.asarray(b, jnp.float32))
    merged = (jnp.asarray(w, jnp.float32) + scale_ * ab).astype(w.dtype)
    layers[group][proj] = dict(layers[group][proj], kernel=merged)
  return dict(base, layers=layers)


def member_in_axes(tree):
  """vmap in_axes of ``tree`` over a population's member axis: 0 everywhere but an `Adapted`'s
  base (None: one copy shared by every member)."""
  is_adapted = lambda x: isinstance(x, Adapted)
  axes = lambda x: (x.replace(base=None, adapters=None if x.adapters is None else 0)
                    if is_adapted(x) else 0)
  return jax.tree.map(axes, tree, is_leaf=is_adapted)


def has_adapted(tree) -> bool:
  """Whether ``tree`` holds an `Adapted` policy."""
  is_adapted = lambda x: isinstance(x, Adapted)
  return any(is_adapted(x) for x in jax.tree.leaves(tree, is_leaf=is_adapted))


def logical_axes(adapters):
  """Logical axes of an adapter tree: the stacked 'layers' axis, the rest unsharded (adapters
  are small; a population's member axis is added by the caller)."""
  return jax.tree.map(lambda x: ('layers',) + (None,) * (np.ndim(x) - 1), adapters)


def is_adapters(tree) -> bool:
  """Whether a parameter tree is an adapter tree (its leaves are all lora_a / lora_b)."""
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  return bool(paths) and all(getattr(p[-1], 'key', None) in ADAPTER_KEYS for p in paths)


def rank_of(adapters) -> int:
  """r of an adapter tree (the last axis of its lora_a leaves)."""
  a = next(x for p, x in jax.tree_util.tree_flatten_with_path(adapters)[0]
           if getattr(p[-1], 'key', None) == 'lora_a')
  return int(np.shape(a)[-1])
