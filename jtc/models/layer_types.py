"""Per-layer types in the scanned decoder: which token mixer and which feed-forward block each
layer has, how their parameters are stacked, and the scan that runs them.

A layer's kind is a pair (mixer, ffn): the mixer from `ModelConfig.layer_types` ('full_attention'
or 'linear_attention', Hugging Face's names), the feed-forward block from
`ModelConfig.ffn_types` ('mlp', or 'moe' for every layer of a model with n_experts > 0:
`jtc.models.moe`). A layer's parameters are the
sub-trees of its *stacks*: 'attn_norm', the mixer's stack ('attn' for full attention,
'linear_attn' for Gated DeltaNet), 'mlp_norm' and the feed-forward block's stack ('mlp', ...).
Each stack holds the layers that have it, in layer order, stacked on a leading axis::

  params['layers'] = {'attn_norm': [Y, ...], 'attn': [Y_attn, ...], 'linear_attn': [Y_lin, ...],
                      'mlp_norm': [Y, ...], 'mlp': [Y_mlp, ...], ...}

so a dense model (every layer full attention + MLP) keeps the layout it always had (every
stack [Y, ...]), and Qwen3.5's 3-linear-1-full pattern has 'attn' [Y/4] and 'linear_attn'
[3Y/4]. Layer i's row in stack s is the number of earlier layers that have s (`rows`). Caches
and other per-layer values follow the same rule: the KV cache of the full-attention layers is
stacked over 'attn' rows only, the linear layers' states over 'linear_attn' rows.

The trunk stays a scan, so compile time does not grow with depth: `segments` cuts the kinds into
runs of a repeating pattern (Qwen3.5-2B: one segment, the pattern (linear, linear, linear, full)
repeated 6 times; a dense model: one segment, one kind repeated Y times), and `scan_layers` scans
each segment over its repeats with the pattern's layers unrolled in the body (a super-block).
`loop_layers` is the same walk as a Python loop over per-layer trees (`split_stacks`), for
decoding on XLA:CPU.

To add a kind: a mixer or feed-forward name in `model_config.LAYER_TYPES` / `FFN_TYPES`, its
stack name here (`MIXER_STACKS` / `FFN_STACKS`), its initialiser in `params.STACK_INITS`, its
logical axes in `jtc.models.axes`, its function in the trunk / `layers.FFNS`, its tensors in
`hf_tensors.tensor_specs` (docs/models.md, "Layer kinds").

Dimension key (docs/dimensions.md): Y layers.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jtc.models.model_config import ModelConfig

# Mixer / feed-forward name -> the name of its parameter stack under params['layers']. A mixture
# of experts keeps its experts and router under 'mlp' (`moe.init_ffn`), so a model cannot mix
# dense and MoE feed-forward layers yet (`ModelConfig` refuses it): that needs a stack of its own.
MIXER_STACKS = {'full_attention': 'attn', 'linear_attention': 'linear_attn'}
FFN_STACKS = {'mlp': 'mlp', 'moe': 'mlp'}


@dataclasses.dataclass(frozen=True)
class LayerKind:
  """The kind of one layer: its token mixer and its feed-forward block (hashable: static)."""
  mixer: str = 'full_attention'
  ffn: str = 'mlp'

  @property
  def mixer_stack(self) -> str:
    return MIXER_STACKS[self.mixer]

  @property
  def ffn_stack(self) -> str:
    return FFN_STACKS[self.ffn]

  @property
  def stacks(self) -> tuple:
    """The stacks this layer has a row in, in block order."""
    return ('attn_norm', self.mixer_stack, 'mlp_norm', self.ffn_stack)


DENSE = LayerKind()


@dataclasses.dataclass(frozen=True)
class Segment:
  """Layers start .. start + len(pattern) * repeats - 1: ``pattern`` repeated ``repeats`` times."""
  start: int
  pattern: tuple
  repeats: int


def kinds(config: ModelConfig) -> tuple:
  """The `LayerKind` of every layer."""
  Y = config.n_layers
  mixers = config.layer_types or ('full_attention',) * Y
  ffns = config.ffn_types or ('moe' if config.is_moe else 'mlp',) * Y
  return tuple(LayerKind(m, f) for m, f in zip(mixers, ffns))


def is_hybrid(config: ModelConfig) -> bool:
  """Whether the layers are not all of one kind."""
  return len(set(kinds(config))) > 1


def stack_sizes(config: ModelConfig) -> dict:
  """{stack name: rows} of the stacks the model has, in first-use order."""
  sizes = {}
  for kind in kinds(config):
    for s in kind.stacks:
      sizes[s] = sizes.get(s, 0) + 1
  return sizes


def rows(config: ModelConfig) -> tuple:
  """Layer i -> {stack: its row in that stack}, for every layer."""
  seen, out = {}, []
  for kind in kinds(config):
    out.append({s: seen.get(s, 0) for s in kind.stacks})
    for s in kind.stacks:
      seen[s] = seen.get(s, 0) + 1
  return tuple(out)


def layers_of(config: ModelConfig, stack: str) -> np.ndarray:
  """The layer indices that have a row in ``stack``, in order ([Y_s] int)."""
  return np.array([i for i, k in enumerate(kinds(config)) if stack in k.stacks], np.int32)


@functools.lru_cache(maxsize=None)
def segments(layer_kinds: tuple) -> tuple:
  """The layers as runs of a repeating pattern: from the first layer not yet covered, the
  pattern (of length p) and repeat count r >= 2 covering the most layers (the shortest pattern
  among equals); a single layer where nothing repeats. One segment for a periodic model."""
  out, i, Y = [], 0, len(layer_kinds)
  while i < Y:
    best = (1, 1)  # (p, r)
    for p in range(1, (Y - i) // 2 + 1):
      pattern = layer_kinds[i:i + p]
      r = 1
      while layer_kinds[i + r * p:i + (r + 1) * p] == pattern:
        r += 1
      if r >= 2 and r * p > best[0] * best[1]:
        best = (p, r)
    p, r = best
    out.append(Segment(i, layer_kinds[i:i + p], r))
    i += p * r
  return tuple(out)


def _slot_in_pattern(pattern) -> list:
  """For each layer of a pattern, {stack: its index among the pattern's layers of that stack};
  and {stack: count} of the pattern."""
  counts, slots = {}, []
  for kind in pattern:
    slots.append({s: counts.get(s, 0) for s in kind.stacks})
    for s in kind.stacks:
      counts[s] = counts.get(s, 0) + 1
  return slots, counts


def remat_barrier(pattern) -> bool:
  """Whether a scan step of these layers puts each rematerialised layer behind an optimisation
  barrier (`jax.checkpoint`'s ``prevent_cse``): iff it holds more than one layer. Without it,
  nothing orders the recomputes of a step's layers after the cotangents that need them, and
  libtpu hoisted them: Qwen3.5-2B's update (3 linear + 1 full attention per step) held four
  layers' recomputed activations at once (docs/scaling.md, "Qwen3.5-2B on one H100"). A
  one-layer step is ordered by the scan itself, and stays barrier-free (JAX's advice for
  `jax.checkpoint` inside `jax.lax.scan`)."""
  return len(pattern) > 1


def scan_layers(fn, carry, stacks, config: ModelConfig, *, remat: bool = False):
  """Runs every layer in order, each segment (`segments`) as one `jax.lax.scan`.

  Args:
    fn: ``fn(kind, carry, layer, rows) -> (carry, out)`` for one layer of `LayerKind` ``kind``:
      ``layer`` is a tuple with, for each dict of ``stacks``, {stack: that layer's row} over
      the stacks of its kind present in the dict; ``rows`` {stack: traced int32 row index};
      ``out`` a dict {stack: pytree} of per-layer outputs (the same structure for every layer
      with that stack).
    carry: the running value (the residual stream, caches updated in place, ...).
    stacks: a tuple of dicts {stack name: pytree stacked on a leading axis of that stack's
      rows} (the parameters' ``params['layers']``, per-layer caches, ...).
    remat: `jax.checkpoint` each layer (its activations recomputed in the backward pass). Where
      a scan step holds several layers (a hybrid's repeating pattern), each layer's recompute
      sits behind an optimisation barrier with its incoming cotangent (``prevent_cse``), so
      the compiler recomputes one layer at a time instead of hoisting every layer's forward
      to the start of the step's backward (`remat_barrier`).

  Returns:
    (carry, {stack: the layers' outputs stacked on a leading axis of the stack's rows}).
  """
  before = {}  # stack -> rows used by earlier segments
  pieces = {}
  for seg in segments(kinds(config)):
    slots, counts = _slot_in_pattern(seg.pattern)
    r = seg.repeats

    def take(x, s):
      """This segment's rows of stack s: [r, ...] for one per repeat, else [r, count, ...]."""
      start, n = before.get(s, 0), r * counts[s]
      if start or n != x.shape[0]:
        x = jax.lax.slice_in_dim(x, start, start + n)
      return x if counts[s] == 1 else x.reshape(r, counts[s], *x.shape[1:])

    xs = tuple(
        {s: jax.tree.map(lambda x, s=s: take(x, s), d[s]) for s in d if s in counts} for d in stacks)
    row_xs = {
        s: take(jnp.arange(before.get(s, 0) + r * counts[s], dtype=jnp.int32), s) for s in counts
    }

    def body(carry, xs_rows, seg=seg, slots=slots, counts=counts):
      xs, row_xs = xs_rows
      outs = {}
      for kind, slot in zip(seg.pattern, slots):
        pick = lambda x, s: x if counts[s] == 1 else x[slot[s]]
        layer = tuple(
            {s: jax.tree.map(lambda x, s=s: pick(x, s), d[s])
             for s in kind.stacks
             if s in d}
            for d in xs)
        layer_rows = {s: pick(row_xs[s], s) for s in kind.stacks}
        step = functools.partial(fn, kind)
        if remat:
          step = jax.checkpoint(step, prevent_cse=remat_barrier(seg.pattern))
        carry, out = step(carry, layer, layer_rows)
        for s, y in out.items():
          outs.setdefault(s, [None] * counts[s])[slot[s]] = y
      stacked = {
          s: ys[0] if counts[s] == 1 else jax.tree.map(lambda *a: jnp.stack(a), *ys)
          for s, ys in outs.items()
      }
      return carry, stacked

    carry, ys = jax.lax.scan(body, carry, (xs, row_xs))
    for s, y in ys.items():
      flat = y if counts[s] == 1 else jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), y)
      pieces.setdefault(s, []).append(flat)
    for s, n in counts.items():
      before[s] = before.get(s, 0) + r * n
  out = {
      s: ys[0] if len(ys) == 1 else jax.tree.map(lambda *a: jnp.concatenate(a), *ys)
      for s, ys in pieces.items()
  }
  return carry, out


def split_stacks(stacked: dict) -> dict:
  """{stack: pytree [Y_s, ...]} -> {stack: tuple of Y_s per-row pytrees} (slices, made once)."""
  split = lambda tree: tuple(
      jax.tree.map(lambda x, i=i: x[i], tree) for i in range(jax.tree.leaves(tree)[0].shape[0]))
  return {s: split(tree) for s, tree in stacked.items()}


def loop_layers(fn, carry, stacks, config: ModelConfig):
  """`scan_layers` as a Python loop over the layers, on stacks from `split_stacks` ({stack:
  tuple of per-row pytrees}); the outputs as tuples of per-row pytrees. Compiles in time linear
  in depth; no layer's weights are sliced out of a stack at run time."""
  outs = {}
  for kind, layer_rows in zip(kinds(config), rows(config)):
    layer = tuple({s: d[s][layer_rows[s]] for s in kind.stacks if s in d} for d in stacks)
    carry, out = fn(kind, carry, layer, {s: jnp.int32(i) for s, i in layer_rows.items()})
    for s, y in out.items():
      outs.setdefault(s, []).append(y)
  return carry, {s: tuple(ys) for s, ys in outs.items()}


def layer_params(layers: dict, config: ModelConfig, i: int) -> dict:
  """Layer i's parameter tree ({stack: its row}) from stacked ``params['layers']``."""
  kind, layer_rows = kinds(config)[i], rows(config)[i]
  return {s: jax.tree.map(lambda x, s=s: x[layer_rows[s]], layers[s]) for s in kind.stacks}
