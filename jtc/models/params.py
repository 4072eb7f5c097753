"""The decoder's parameters: random initialisation (one layer's initialiser per stack, vmapped
over its rows) and the conversion from the earlier per-layer layout. The layout is documented in
`jtc.models.model`, the stacks of a hybrid in `jtc.models.layer_types`, the logical axes in
`jtc.models.axes`.

Dimension key (docs/dimensions.md): V vocab, D model dim, Y layers, N query heads, K kv heads,
H head dim, F mlp dim.
"""

import functools
import math
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import gated_deltanet
from jtc.models import layer_types
from jtc.models import moe
from jtc.models.model_config import ModelConfig


def num_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


def _normal(key, shape, fan_in, dtype):
  """N(0, 1/fan_in) in `dtype`."""
  return jax.random.normal(key, shape, dtype) * jnp.asarray(1.0 / math.sqrt(fan_in), dtype)


def _init_attn(c: ModelConfig, keys) -> dict:
  D, N, K, H = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
  dt = c.jnp_param_dtype
  kq, kk, kv, ko = keys
  attn = {
      'q': {
          'kernel': _normal(kq, (D, N, H), D, dt)
      },
      'k': {
          'kernel': _normal(kk, (D, K, H), D, dt)
      },
      'v': {
          'kernel': _normal(kv, (D, K, H), D, dt)
      },
      'o': {
          'kernel': _normal(ko, (N, H, D), N * H, dt)
      }
  }
  if c.attn_bias:
    for name, heads in (('q', N), ('k', K), ('v', K)):
      attn[name]['bias'] = jnp.zeros((heads, H), dt)
  if c.qk_norm:
    attn['q_norm'] = {'scale': _norm_scale(c, H)}
    attn['k_norm'] = {'scale': _norm_scale(c, H)}
  if c.attn_output_gate:
    attn['q_gate'] = {'kernel': _normal(jax.random.fold_in(kq, 1), (D, N, H), D, dt)}
  return attn


def _init_mlp(c: ModelConfig, keys) -> dict:
  """The dense SwiGLU MLP, or every layer's mixture of experts when n_experts > 0."""
  D, F, dt = c.d_model, c.d_ff, c.jnp_param_dtype
  kg, ku, kd = keys
  if c.is_moe:
    return moe.init_ffn(c, kg)
  return {
      'gate': {
          'kernel': _normal(kg, (D, F), D, dt)
      },
      'up': {
          'kernel': _normal(ku, (D, F), D, dt)
      },
      'down': {
          'kernel': _normal(kd, (F, D), F, dt)
      }
  }


def _norm_scale(c: ModelConfig, size: int):
  """An RMSNorm weight at identity: 1, or 0 when stored zero-centred."""
  return jnp.full((size,), 0.0 if c.norm_zero_centered else 1.0, c.jnp_param_dtype)


# Stack name -> fn(config, the layer's 7 keys) -> that stack's row. A layer's key is split in 7:
# the mixer draws from the first 4, the feed-forward block from the last 3 (a dense layer's
# values are those of the layout before per-layer types).
STACK_INITS = {
    'attn_norm': lambda c, ks: {
        'scale': _norm_scale(c, c.d_model)
    },
    'mlp_norm': lambda c, ks: {
        'scale': _norm_scale(c, c.d_model)
    },
    'attn': lambda c, ks: _init_attn(c, ks[:4]),
    'linear_attn': lambda c, ks: gated_deltanet.init_params(c, ks[0]),
    'mlp': lambda c, ks: _init_mlp(c, ks[4:7]),
}


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(config: ModelConfig, rng: jax.Array) -> dict:
  c = config
  k_embed, k_layers, k_head = jax.random.split(rng, 3)
  layer_keys = jax.random.split(k_layers, c.n_layers)
  stacks = {}
  for s in layer_types.stack_sizes(c):
    init = functools.partial(STACK_INITS[s], c)
    stacks[s] = jax.vmap(lambda key, init=init: init(jax.random.split(key, 7)))(
        layer_keys[layer_types.layers_of(c, s)])
  params = {
      'embed': {
          'embedding': _normal(k_embed, (c.vocab_size, c.d_model), c.d_model, c.jnp_param_dtype)
      },
      'layers': stacks,
      'final_norm': {
          'scale': _norm_scale(c, c.d_model)
      }
  }
  if not c.tie_embeddings:
    params['lm_head'] = {
        'kernel': _normal(k_head, (c.d_model, c.vocab_size), c.d_model, c.jnp_param_dtype)
    }
  return params


def init_params(config: ModelConfig, rng: jax.Array) -> dict:
  """Random parameters in the layout documented in `jtc.models.model`.

  Kernels ~ N(0, 1/fan_in), embedding ~ N(0, 1/D), norm scales at identity, biases 0 (Gated
  DeltaNet: `gated_deltanet.init_params`). Each stack's initialiser is traced once and vmapped
  over its rows, so the cost does not grow with depth.
  """
  return _init_params_jit(config, rng)


def _layer_names(params) -> list:
  names = [k for k in params if k.startswith('layers_')]
  return sorted(names, key=lambda k: int(k.split('_', 1)[1]))


def stack_layers(params: dict) -> dict:
  """Earlier per-layer layout {'layers_0': {...}, ..., 'layers_{Y-1}': {...}} -> 'layers'
  stacked on a leading axis (values unchanged); stacked params are returned as they are.

  Works on numpy or jax arrays (numpy stays numpy: nothing is put on a device)."""
  names = _layer_names(params)
  if not names:
    return params
  if 'layers' in params:
    raise ValueError(f'params have both stacked "layers" and per-layer {names[:2]}...')
  if names != [f'layers_{i}' for i in range(len(names))]:
    raise ValueError(f'per-layer params must be layers_0 .. layers_{len(names) - 1}, got {names}')
  stack = lambda *xs: (np.stack if isinstance(xs[0], np.ndarray) else jnp.stack)(xs)
  out = {k: v for k, v in params.items() if k not in names}
  out['layers'] = jax.tree_util.tree_map(stack, *[params[n] for n in names])
  return out


def unstack_layers(params: dict) -> dict:
  """Inverse of `stack_layers`: 'layers' [Y, ...] -> {'layers_0': ..., 'layers_{Y-1}': ...}
  (models whose layers are all of one kind)."""
  if 'layers' not in params:
    return params
  sizes = {x.shape[0] for x in jax.tree_util.tree_leaves(params['layers'])}
  if len(sizes) != 1:
    raise ValueError(f'unstack_layers: the stacks have different row counts {sorted(sizes)} '
                     '(a model with several layer kinds has no per-layer layout)')
  Y = sizes.pop()
  out = {k: v for k, v in params.items() if k != 'layers'}
  for i in range(Y):
    out[f'layers_{i}'] = jax.tree_util.tree_map(lambda x, i=i: x[i], params['layers'])
  return out
