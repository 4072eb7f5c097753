"""Device mesh, logical-axis rules and sharded jit: the one place that knows about devices.

Mesh axes:
  'population'  the members of a seed population (`jtc.rl.population`): each device holds
           whole members (their parameters, optimiser state and batches), size 1 for a run;
  'data'   pure data parallelism (parameters replicated);
  'fsdp'   data parallelism with parameters (and so optimiser state) sharded over 'embed';
  'tensor' Megatron-style model parallelism over heads, MLP hidden units and vocabulary;
  'expert' expert parallelism: a mixture-of-experts layer's experts split over it (`jtc.models.moe`;
           the rest of the model runs replicated along it). With policy.moe_dispatch
           'replicated' each device computes its experts for all of its tokens and the chosen
           experts' outputs are summed over the axis (one non-zero term each, so the sum is
           exact); with 'all_to_all' the layer's tokens split over it and go to their experts'
           devices by an all-to-all (`jtc.models.moe_dispatch`). Size 1 for a dense model.

The model names *logical* axes only (`jtc.models.model.param_logical_axes`, `model.CACHE_AXES`);
`LOGICAL_AXIS_RULES` below maps them to mesh axes. A dimension whose size is not divisible by
the product of its mesh axes keeps the longest prefix of those axes that divides it (possibly
none, i.e. replicated), so every preset runs on every mesh.

Single host: `mesh = make_mesh(data=1, fsdp=-1, tensor=1)` (-1: all remaining devices), then
`shard_params`, `shard_batch`, and `jax.jit(fn, in_shardings=..., out_shardings=...)` with these
NamedShardings. Anything jitted on sharded inputs (e.g. `jtc.models.sampler.sample`) also runs
sharded: XLA propagates the input shardings.

Multi-host (TPU pods, GPU clusters): `jtc.rl.distributed.initialize()` first thing in *every*
process, before any other JAX call (`jax.distributed.initialize`; on TPU/SLURM/Open MPI the
coordinator, process count and id are detected, otherwise JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID say them). `jax.devices()` then
lists every host's devices and `make_mesh` spans them all. The trainer reads the same global
batch in every process (host-side rewards and advantages are replicated) and places it with
`to_device`, each process filling its own shards; a pipeline that reads a per-process slice
instead assembles the global array with `host_local_to_global`. Parameters are created with `jax.jit(init_params, out_shardings=...)` so no
host ever holds them whole.

Dimension key (docs/dimensions.md): B batch, L sequence length, plus the model's (see `jtc.models.model`).
"""

import dataclasses
import math
import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jtc.models import axes as axes_lib
from jtc.models import decode
from jtc.models import gated_deltanet
from jtc.models import lora
from jtc.models import model as model_lib

MESH_AXES = ('population', 'data', 'fsdp', 'expert', 'tensor')
CPU_DEVICES_FLAG = re.compile(r'--xla_force_host_platform_device_count=(\d+)')

# logical axis -> mesh axis / tuple of mesh axes / None (replicated).
LOGICAL_AXIS_RULES = {
    # The leading member axis of a population's values ([E, ...]).
    'members': 'population',
    # Activations, batches and the KV cache.
    'batch': ('data', 'fsdp'),
    'length': None,
    'cache_length': None,
    # The stacked-layer axis of parameters and KV caches ([Y, ...]): never sharded (the layer
    # scan reads one layer at a time).
    'layers': None,
    # Parameters.
    'vocab': 'tensor',
    'embed': 'fsdp',
    'heads': 'tensor',
    'kv_heads': 'tensor',
    'head_dim': None,
    'mlp': 'tensor',
    'norm': None,
    # The experts of a mixture-of-experts layer ([X, ...] expert weights).
    'experts': 'expert',
}


def make_mesh(*, population: int = 1, data: int = 1, fsdp: int = -1, tensor: int = 1,
              expert: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """A `MESH_AXES` mesh; at most one size may be -1 (= the rest)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = {'population': population, 'data': data, 'fsdp': fsdp, 'expert': expert, 'tensor': tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1 or any(v == 0 or v < -1 for v in sizes.values()):
    raise ValueError(f'mesh sizes {sizes} invalid: positive ints, at most one -1')
  if free:
    known = math.prod(v for v in sizes.values() if v != -1)
    if len(devices) % known:
      raise ValueError(f'{len(devices)} devices not divisible by mesh sizes {sizes}')
    sizes[free[0]] = len(devices) // known
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(f'mesh sizes {sizes} do not multiply to {len(devices)} devices')
  grid = np.array(devices, dtype=object).reshape([sizes[a] for a in MESH_AXES])
  return Mesh(grid, MESH_AXES)


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: dict = LOGICAL_AXIS_RULES) -> PartitionSpec:
  """PartitionSpec for an array of `shape` whose dimensions have these logical names."""
  if len(logical_axes) != len(shape):
    raise ValueError(f'logical axes {logical_axes} do not match shape {shape}')
  used, spec = set(), []
  for name, size in zip(logical_axes, shape):
    if name is not None and name not in rules:
      raise ValueError(f'unknown logical axis {name!r}; valid: {sorted(rules)}')
    target = rules.get(name) if name is not None else None
    target = (target,) if isinstance(target, str) else tuple(target or ())
    chosen = []
    for axis in target:
      if axis in used or size % (math.prod(mesh.shape[a] for a in chosen) * mesh.shape[axis]):
        break
      chosen.append(axis)
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def named_sharding(mesh: Mesh, logical_axes, shape) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical_axes, shape, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def param_shardings(params, mesh: Mesh, members: int = 0):
  """A pytree like `params` of NamedShardings (works on arrays or ShapeDtypeStructs); with
  ``members`` = E > 0, of the population's [E, ...] copies of those (one member's) params."""
  # LoRA adapters (`jtc.models.lora`): small, sharded over the layers and members only.
  axes = (lora.logical_axes(params)
          if lora.is_adapters(params) else model_lib.param_logical_axes(params))
  linear = params.get('layers', {}).get('linear_attn') if isinstance(params, dict) else None
  if linear is not None and 'a_log' in linear:  # a hybrid's Gated DeltaNet heads over 'tensor'
    gated_deltanet.check_tensor_axis(linear, mesh.shape['tensor'])
  lead = (('members',), (members,)) if members else ((), ())
  return jax.tree_util.tree_map(
      lambda a, x: named_sharding(mesh, lead[0] + a, lead[1] + tuple(x.shape)), axes, params,
      is_leaf=lambda x: isinstance(x, tuple))


def shard_params(params, mesh: Mesh):
  return jax.device_put(params, param_shardings(params, mesh))


def batch_sharding(mesh: Mesh, shape: Sequence[int], members: bool = False) -> NamedSharding:
  """Leading dimension over ('data', 'fsdp'), the rest replicated ([B, ...] arrays); with
  ``members``, a population's [E, B, ...] arrays: E over 'population', then the same."""
  lead = ('members',) if members else ()
  return named_sharding(mesh, lead + ('batch',) + (None,) * (len(shape) - 1 - len(lead)), shape)


def batch_shardings(tree, mesh: Mesh):
  return jax.tree_util.tree_map(lambda x: batch_sharding(mesh, x.shape), tree)


def shard_batch(tree, mesh: Mesh):
  """device_put every [B, ...] leaf with the batch sharding."""
  return jax.device_put(tree, batch_shardings(tree, mesh))


def cache_shardings(cache, mesh: Mesh):
  """Shardings for a `model.KVCache` or `decode.GroupCache`: keys/values [Y, B, K, S, H] over
  (-, batch, kv_heads, -, -) (the group cache's transposed completion keys [Y, R, K, H, S]
  likewise), masks [B, S] over (batch, -), per-row lengths and prompts [R] over (batch,),
  shared counters replicated."""
  kv = lambda x, axes=model_lib.CACHE_AXES: named_sharding(mesh, axes, x.shape)
  mask = lambda x: named_sharding(mesh, model_lib.CACHE_MASK_AXES, x.shape)
  # A hybrid's linear-attention states (`gated_deltanet.LinearState` [Y, B, ...]): rows over batch.
  linear = lambda s: None if s is None else jax.tree.map(
      lambda axes, x: named_sharding(mesh, axes, x.shape), gated_deltanet.STATE_AXES, s, is_leaf=
      lambda x: isinstance(x, tuple))
  if isinstance(cache, decode.GroupCache):
    k_axes = model_lib.CACHE_AXES[:3] + model_lib.CACHE_AXES[:2:-1]  # [Y, R, K, H, S]
    rows = lambda x: None if x is None else (replicated(mesh) if x.ndim == 0 else named_sharding(
        mesh, ('batch',), x.shape))
    return decode.GroupCache(prompt_k_YBKPH=kv(cache.prompt_k_YBKPH),
                             prompt_v_YBKPH=kv(cache.prompt_v_YBKPH),
                             prompt_mask_BP=mask(cache.prompt_mask_BP),
                             k_YRKHT=kv(cache.k_YRKHT, k_axes), v_YRKTH=kv(cache.v_YRKTH),
                             length=rows(cache.length), prompt_R=rows(cache.prompt_R),
                             linear=linear(cache.linear), prompt_linear=linear(cache.prompt_linear))
  return model_lib.KVCache(k=kv(cache.k), v=kv(cache.v), mask_BS=mask(cache.mask_BS),
                           index=replicated(mesh), linear=linear(cache.linear))


@dataclasses.dataclass(frozen=True)
class RowSharding:
  """tree -> its shardings with the rows over the batch axes: a `decode.GroupCache` by
  `cache_shardings`, every other leaf [B, ...] by `batch_sharding`. Hashable (equal meshes,
  equal instances), so jitted model code takes it as a static ``row_sharding`` and constrains
  its activations and KV cache to it: the rows split over (data, fsdp) even where XLA's
  propagation would follow the parameters' fsdp-sharded model dimension instead (which
  replicates the rows), and the sampler's R = B x G cache rows split even when the B prompts
  cannot. Inside a vmap over a population's members, vmap with spmd_axis_name='population'."""
  mesh: Mesh

  def __call__(self, tree):
    if isinstance(tree, decode.GroupCache):
      return cache_shardings(tree, self.mesh)
    return jax.tree_util.tree_map(lambda x: batch_sharding(self.mesh, x.shape), tree)


# The sampler's decode layout (`DecodeLayout`): a decode step multiplies every weight by one token
# per row, so a weight split over the batch axes ('embed' over 'fsdp') would be gathered again at
# every step; the sampler reshards the weights once per call instead, whole over the batch axes
# and still split over 'tensor', and frees that copy when the call returns.
DECODE_AXIS_RULES = {**LOGICAL_AXIS_RULES, 'embed': None}
DECODE_LAYOUTS = ('auto', 'fsdp', 'tensor')


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
  """params -> the same parameters constrained to the decode layout (`DECODE_AXIS_RULES`;
  leaves that are not model parameters, a LoRA policy's factors, as they are). Hashable, a
  static argument of the sampler, which calls it once, before its decode loop."""
  mesh: Mesh

  def __call__(self, params):

    def constrain(path, x):
      names = axes_lib.leaf_logical_axes(path)
      if names is None or len(names) != x.ndim:
        return x
      spec = logical_to_spec(names, x.shape, self.mesh, DECODE_AXIS_RULES)
      return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    return jax.tree_util.tree_map_with_path(constrain, params)


def decode_layout_choice(name: str, mesh: Mesh | None, model_config,
                         free_bytes: int | None) -> tuple:
  """(the layout config.rollout.decode_layout ``name`` takes: 'fsdp' (the training layout) or
  'tensor' (`DecodeLayout`), why). 'fsdp' when asked, without a mesh, or with nothing split
  over the batch axes; 'auto' takes 'tensor' when a chip's share of the parameters of
  ``model_config`` (1 / the tensor axis) is at most a quarter of its share of ``free_bytes``
  (the devices' free memory, summed; always when a device reports none)."""
  if name not in DECODE_LAYOUTS:
    raise ValueError(f'config.rollout.decode_layout={name!r} is not one of {list(DECODE_LAYOUTS)}')
  if name == 'fsdp':
    return 'fsdp', 'configured'
  if mesh is None or mesh.shape['fsdp'] == 1:
    return 'fsdp', 'mesh.fsdp = 1: the training layout gathers no weights'
  if name == 'tensor':
    return 'tensor', 'configured'
  shapes = jax.eval_shape(lambda: model_lib.init_params(model_config, jax.random.key(0)))
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
  per_chip = param_bytes / mesh.shape['tensor']
  if free_bytes is None:
    return 'tensor', 'auto: the devices report no free memory'
  free_chip, gib = free_bytes / math.prod(mesh.shape.values()), 2.0**30
  share = (f'a chip\'s share of the weights {per_chip / gib:.3g} GiB vs a quarter of its free '
           f'{free_chip / gib:.3g} GiB')
  if per_chip > free_chip / 4:
    return 'fsdp', f'auto: {share} (too large to hold whole over the batch axes)'
  return 'tensor', f'auto: {share}'


def decode_layout(name: str, mesh: Mesh | None, model_config, free_bytes: int | None):
  """The sampler's ``decode_layout`` argument for config.rollout.decode_layout ``name``: None
  (the training layout) or a `DecodeLayout`, as `decode_layout_choice` chooses."""
  chosen, _ = decode_layout_choice(name, mesh, model_config, free_bytes)
  return DecodeLayout(mesh) if chosen == 'tensor' else None


def host_local_to_global(tree, mesh: Mesh):
  """Assemble per-process [B_local, ...] batches into global [B, ...] arrays on `mesh`."""

  def to_global(x):
    x = np.asarray(x)
    global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(batch_sharding(mesh, global_shape), x,
                                                  global_shape)

  return jax.tree_util.tree_map(to_global, tree)


def to_device(x, sharding: NamedSharding) -> jax.Array:
  """A host array -> a global jax.Array with ``sharding`` (multi-host safe: each process fills
  its addressable shards from the same full host value)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(tree):
  """Global arrays -> numpy on every process (an all-gather when the mesh spans hosts)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


def mesh_sizes(data: int, fsdp: int, tensor: int, population: int = 1, expert: int = 1,
               n_devices: int | None = None) -> dict:
  """{'population', 'data', 'fsdp', 'expert', 'tensor'} sizes with a -1 resolved to the remaining
  devices; a ValueError naming `config.mesh` when they do not fit the devices."""
  n = jax.device_count() if n_devices is None else n_devices
  sizes = {'population': population, 'data': data, 'fsdp': fsdp, 'expert': expert, 'tensor': tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1 or any(v == 0 or v < -1 for v in sizes.values()):
    raise ValueError(f'config.mesh.population/data/fsdp/expert/tensor = {list(sizes.values())} '
                     'are invalid: positive ints, at most one -1 (= the remaining devices)')
  known = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if n % known:
      raise ValueError(f'{n} devices do not split over config.mesh = {sizes}')
    sizes[free[0]] = n // known
  if math.prod(sizes.values()) != n:
    raise ValueError(f'config.mesh = {sizes} does not multiply to the {n} devices')
  return sizes


def check_batch_rows(rows: int, sizes: dict) -> None:
  """A (micro-)batch of ``rows`` sequences must split over the mesh's batch axes."""
  n = sizes['data'] * sizes['fsdp']
  if rows % n:
    raise ValueError(f'a (micro-)batch of {rows} sequences (config.optim.microbatch_prompts or '
                     'minibatch_prompts, times the group size) does not split over the '
                     f'{n} devices of config.mesh.data x config.mesh.fsdp')


def reserve_cpu_threads(environ=None):
  """Sets $PJRT_NPROC to 2N + 2 (at least the cores) when XLA_FLAGS asks for N > 1 CPU devices
  in this process and neither $PJRT_NPROC nor $NPROC is set; returns the value set, else None.
  Call it before JAX creates its CPU client (`distributed.initialize` does, first thing).

  Why: XLA's CPU client runs each device's launch and execution on one pool of max(cores,
  devices) threads ($PJRT_NPROC or $NPROC replaces the cores: xla/pjrt/utils.cc
  DefaultThreadPoolSize). A launch blocks its thread while the device has 32 computations in
  flight (a pacing semaphore in xla/pjrt/cpu/cpu_client.cc), and a collective's participants
  block theirs until all have arrived. With 2 cores and 2 devices, one launch and one waiting
  participant take the whole pool: the computations holding the semaphore never run, and after
  40 s XLA aborts the process ("Termination timeout for `all reduce ...` of 40 seconds
  exceeded"). That needs many small computations queued (eager ops under load). N blocked
  launches and N - 1 waiting participants at most leave a 2N + 2 pool a free thread.
  """
  env = os.environ if environ is None else environ
  found = CPU_DEVICES_FLAG.findall(env.get('XLA_FLAGS', ''))
  n = int(found[-1]) if found else 1
  if n <= 1 or env.get('PJRT_NPROC') or env.get('NPROC'):
    return None
  env['PJRT_NPROC'] = str(max(len(os.sched_getaffinity(0)), 2 * n + 2))
  return env['PJRT_NPROC']
