"""Expert parallelism with a token all-to-all: a mixture-of-experts layer's (token, expert) pairs
sent to the devices that hold their experts and the experts' outputs sent back
(`ModelConfig.moe_dispatch='all_to_all'`; `jtc.models.moe` routes the tokens first, unchanged).

`ModelConfig.moe_dispatch` (`DISPATCHES`):
  replicated  the tokens stay replicated along the mesh's 'expert' axis: each device runs its
              experts (the stacked weights split over that axis) on all of its tokens, and XLA's
              partitioner sums the chosen experts' outputs across the axis (or gathers the
              weights, for the sorted forms); no mesh is needed.
  all_to_all  inside one `jax.shard_map` over the mesh in context (`mesh_context`):
    1. the tokens split over the mesh's ('data', 'fsdp', 'expert') axes (u per device, the
       token count padded to a multiple of the devices), the X experts over 'expert' (X / n on
       each of its n devices);
    2. each device sorts its u W (token, expert) pairs by destination (the device holding the
       expert: expert // (X / n)) into a send buffer of n x C slots, C = u W;
    3. `jax.lax.all_to_all` over 'expert' exchanges the slots (with each slot's local expert
       and whether it is filled);
    4. each device runs its X / n experts on what it received, `ModelConfig.moe_impl`'s
       grouped form ('ragged': `jax.lax.ragged_dot` over its sorted pairs);
    5. the inverse all-to-all returns each slot's output to its sender, which mixes a token's W
       outputs with its router weights: y = sum_j w_j expert_j(x).

Dropless by a worst-case capacity: C = u W slots per destination, as many as a device has pairs,
so that all of its pairs fit even when every one goes to the same device (no capacity factor,
nothing dropped, shapes static). The price is n times the buffer and traffic of an even
routing; exchanging the counts first (`jax.lax.ragged_all_to_all`, sized by the real pairs) would
cut the traffic to the pairs sent, and is not done. The routing (top-W, replay) is computed before
the dispatch, on every device alike. Not under a population's vmap (`jtc.rl.routing` refuses it);
attention and the rest of the layer run replicated along 'expert' as before.

Dimension key (docs/dimensions.md): U tokens, D model dim, W experts per token, X experts, C the
slots one device sends to another; lower-case n the devices of the expert axis (the send and
receive buffers are [n, C, ...]).
"""

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jtc.models.model_config import MOE_DISPATCHES

DISPATCHES = MOE_DISPATCHES
EXPERT_AXIS = 'expert'
# The mesh axes the tokens are split over inside the dispatch (those of the mesh in context).
TOKEN_AXES = ('data', 'fsdp', 'expert')
EXPERT_KEYS = ('expert_gate', 'expert_up', 'expert_down')


def mesh_context(mesh, model_config):
  """``jax.set_mesh(mesh)`` when ``model_config`` dispatches with an all-to-all (the mesh its
  `jax.shard_map` runs over; enter it around tracing, lowering and calling the jitted functions),
  else a context that does nothing."""
  if getattr(model_config, 'moe_dispatch', 'replicated') != 'all_to_all' or mesh is None:
    return contextlib.nullcontext()
  return jax.set_mesh(mesh)


def _mesh(n_experts):
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or EXPERT_AXIS not in mesh.axis_names:
    raise ValueError("ModelConfig.moe_dispatch='all_to_all' needs a device mesh with an 'expert' "
                     'axis in context (jax.set_mesh(mesh); the trainer and `jtc plan` set it); '
                     f'valid dispatches: {list(DISPATCHES)}')
  n = mesh.shape[EXPERT_AXIS]
  if n_experts % n:
    raise ValueError(f'config.mesh.expert={n} must divide the policy\'s n_experts={n_experts} '
                     f'(valid: {[d for d in range(1, n_experts + 1) if n_experts % d == 0]})')
  return mesh


def _local_pairs(p, x_UD, experts_UW, weights_UW, *, experts_fn, dtype, n):
  """One device's part of `exchange` (inside the shard_map): its u tokens' pairs out, its own
  experts run on the pairs it receives, the outputs back and mixed: y [u, D]."""
  U, W = experts_UW.shape
  D = x_UD.shape[-1]
  x_local = p['expert_gate']['kernel'].shape[0]  # this device's experts, X / n
  C = U * W  # slots per destination: every pair of this device could go to one device
  expert_of_pair = experts_UW.reshape(-1)  # [U W], pair u * W + j
  dest_of_pair = expert_of_pair // x_local
  order = jnp.argsort(dest_of_pair, stable=True)  # pairs grouped by destination
  sizes = jnp.bincount(dest_of_pair, length=n)
  start = jnp.cumsum(sizes) - sizes  # first sorted pair of each destination
  # Slot (d, c) of the send buffer holds sorted pair start_d + c if c < sizes_d (else nothing).
  filled = jnp.arange(C)[None, :] < sizes[:, None]  # [n, C]
  pair = jnp.take(order, jnp.minimum(start[:, None] + jnp.arange(C)[None, :], C - 1))
  x_sent = jnp.where(filled[..., None], jnp.take(x_UD, pair // W, axis=0), 0)  # [n, C, D]
  local_sent = jnp.where(filled, jnp.take(expert_of_pair, pair) % x_local, 0)
  swap = functools.partial(jax.lax.all_to_all, axis_name=EXPERT_AXIS, split_axis=0, concat_axis=0,
                           tiled=True)
  x_got, local_got, filled_got = swap(x_sent), swap(local_sent), swap(filled)
  # This device's experts on every received slot (an empty one runs local expert 0, then is
  # zeroed): weight 1, so each slot's output is expert_j(x) alone.
  y_got = experts_fn(p, x_got.reshape(n * C, D), local_got.reshape(n * C, 1),
                     jnp.ones((n * C, 1), jnp.float32), dtype)
  y_got = jnp.where(filled_got.reshape(n * C, 1), y_got, 0).reshape(n, C, D)
  y_back = swap(y_got)  # [n, C, D]: slot (d, c) is what this device sent there
  dest_sorted = jnp.take(dest_of_pair, order)
  y_sorted = y_back[dest_sorted, jnp.arange(C) - start[dest_sorted]]  # [U W, D], sorted pairs
  y_UWD = jnp.take(y_sorted, jnp.argsort(order), axis=0).reshape(U, W, D)
  return jnp.einsum('UWD,UW->UD', y_UWD, weights_UW.astype(dtype))


def exchange(experts_fn, p, x_UD, experts_UW, weights_UW, dtype):
  """sum_j w_j expert_j(x) [U, D] with the tokens exchanged over the mesh's 'expert' axis (module
  docstring); ``experts_fn`` is one of `jtc.models.moe.MOE_IMPLS` (the same signature), run on
  each device's experts. Needs the mesh in context (`mesh_context`)."""
  U, W = experts_UW.shape
  mesh = _mesh(p['expert_gate']['kernel'].shape[0])
  token_axes = tuple(a for a in TOKEN_AXES if a in mesh.axis_names)
  pad = -U % math.prod(
      mesh.shape[a] for a in token_axes)  # padded tokens: expert 0, weight 0, cut off after
  if pad:
    x_UD = jnp.pad(x_UD, ((0, pad), (0, 0)))
    experts_UW = jnp.pad(experts_UW, ((0, pad), (0, 0)))
    weights_UW = jnp.pad(weights_UW, ((0, pad), (0, 0)))
  tokens = PartitionSpec(token_axes, None)
  experts = PartitionSpec(EXPERT_AXIS, None, None)
  local = functools.partial(_local_pairs, experts_fn=experts_fn, dtype=dtype,
                            n=mesh.shape[EXPERT_AXIS])
  y_UD = jax.shard_map(
      local, mesh=mesh, in_specs=({
          name: {
              'kernel': experts
          } for name in EXPERT_KEYS
      }, tokens, tokens, tokens), out_specs=tokens)({
          name: p[name] for name in EXPERT_KEYS
      }, x_UD, experts_UW.astype(jnp.int32), weights_UW)
  return y_UD[:U]
