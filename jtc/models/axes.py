"""Logical axes of every parameter and cache field of `jtc.models.model` (`jtc.rl.sharding` maps
them to mesh axes); `jtc.models.model` re-exports them.

Dimension key (docs/dimensions.md): Y layers, B batch, K kv heads, S cache slots, H head dim.
A hybrid's Gated DeltaNet parameters have their own table (`gated_deltanet.PARAM_AXES`).
"""

from typing import Any

import jax

from jtc.models import gated_deltanet
from jtc.models import moe

_PARAM_AXES = {
    ('embed', 'embedding'): ('vocab', 'embed'),
    ('attn_norm', 'scale'): ('norm',),
    ('mlp_norm', 'scale'): ('norm',),
    ('final_norm', 'scale'): ('norm',),
    ('q', 'kernel'): ('embed', 'heads', 'head_dim'),
    ('q', 'bias'): ('heads', 'head_dim'),
    ('q_gate', 'kernel'): ('embed', 'heads', 'head_dim'),
    ('k', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('k', 'bias'): ('kv_heads', 'head_dim'),
    ('v', 'kernel'): ('embed', 'kv_heads', 'head_dim'),
    ('v', 'bias'): ('kv_heads', 'head_dim'),
    ('o', 'kernel'): ('heads', 'head_dim', 'embed'),
    ('q_norm', 'scale'): ('head_dim',),
    ('k_norm', 'scale'): ('head_dim',),
    ('gate', 'kernel'): ('embed', 'mlp'),
    ('up', 'kernel'): ('embed', 'mlp'),
    ('down', 'kernel'): ('mlp', 'embed'),
    ('lm_head', 'kernel'): ('embed', 'vocab'),
    **moe.PARAM_AXES,
}

# Stacks (`jtc.models.layer_types`) whose parameters have their own table, keyed by the path
# below the stack's name (their names would clash with attention's).
_STACK_AXES = {'linear_attn': gated_deltanet.PARAM_AXES}

# Logical axes of the KV caches ([Y, B, K, S, H] and [B, S]) and of activations/batches.
CACHE_AXES = ('layers', 'batch', 'kv_heads', 'cache_length', 'head_dim')
CACHE_MASK_AXES = ('batch', 'cache_length')


def param_logical_axes(params) -> Any:
  """A pytree like `params` whose leaves are tuples of logical axis names; parameters under
  'layers' get the stacked 'layers' axis first."""

  def axes(path, leaf):
    keys = tuple(p.key for p in path)
    stack = next((s for s in _STACK_AXES if s in keys), None)
    table = _PARAM_AXES if stack is None else _STACK_AXES[stack]
    key = keys[-2:] if stack is None else keys[keys.index(stack) + 1:]
    if key not in table:
      raise ValueError(f'no logical axes for parameter {jax.tree_util.keystr(path)}; '
                       f"known{'' if stack is None else ' below ' + stack}: {sorted(table)}")
    names = table[key]
    if path[0].key == 'layers':
      names = ('layers',) + names
    if len(names) != leaf.ndim:
      raise ValueError(f'parameter {jax.tree_util.keystr(path)} has shape {leaf.shape}, '
                       f'expected rank {len(names)} for axes {names}')
    return names

  return jax.tree_util.tree_map_with_path(axes, params)
