"""DelTA's hidden states recomputed row chunk by row chunk instead of held (``delta.hidden =
'recomputed'``): a memory/compute trade like remat.

DelTA's token-gradient proxy ``v = (1 - p(y)) h`` (DelTA Implementation) needs the final-normed
hidden state ``h`` of every completion token, and its coefficients (eq:centroid-decomposition,
eq:DelTA-alpha) need 2K + 2 passes over v for K = num_refine refinements: the first centroids
and ||v||^2, then per iteration the projections v . mu_Z and, but after the last, the
alpha-weighted sums. With ``'held'`` the behaviour pass returns the [B, T, D] hidden states of
every row of the step and they live until the coefficient pass has read them. With
``'recomputed'`` the behaviour pass returns none: each of the 2K + 2 passes maps over n chunks of
B / n rows, recomputes their hidden states with the behaviour pass's own forward
(`jtc.models.logprobs.completion_hidden`, the same parameters, tokens and replayed experts) and
runs `delta_geometry.proxy_pass` on them, so one [B / n, T, D] block exists at a time and no
step-wide one ever does. The per-token outputs of the chunks are stacked back into row order and
their per-(segment, side) sums added: the result is the held pass's up to float32 round-off.
Cost: 2K + 2 forward passes of the policy without its head (4 for K = 1; the paper's own
implementation spends K + 2; fusing the first pass into the behaviour pass, which would save
one, is not done: it would need the advantages there).

Rows stay on their devices: chunk i holds the strided rows {r n + i} (n chunks of B / n rows;
the rows reshaped [B / n, n] and the chunk axis moved first), so with the rows split over the
devices in contiguous blocks each device's rows of every chunk are its own (a local transpose),
and each chunk's arrays are constrained to the rows' sharding.

Dimension key (docs/dimensions.md): B rows (of the batch, or of one chunk inside a pass), T
completion length, L = P + T, D model dim, n chunks, I scope segments, Z side.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from jtc.models import logprobs

Array = jax.Array

HIDDEN_MODES = ('held', 'recomputed')


@flax.struct.dataclass
class RecomputedHidden:
  """The final-normed hidden states [B, T, D] of a batch, recomputed ``chunk_rows`` rows at a
  time: ``forward(params, inputs of B / n rows) -> [B / n, T, D]`` (`behaviour_forward`).

  params: the policy of the behaviour pass; inputs: {'tokens_BL', 'input_mask_BL',
  'replay_BLYW' (None but for a MoE policy replaying its experts)}, every leaf [B, ...]."""
  params: Any
  inputs: dict
  forward: Callable = flax.struct.field(pytree_node=False)
  length: int = flax.struct.field(pytree_node=False)
  dim: int = flax.struct.field(pytree_node=False)
  chunk_rows: int = flax.struct.field(pytree_node=False)

  @property
  def shape(self):
    return (self.inputs['tokens_BL'].shape[0], self.length, self.dim)

  @property
  def num_chunks(self) -> int:
    """n: the row chunks (`rows_per_chunk`)."""
    return self.shape[0] // rows_per_chunk(self.shape[0], self.chunk_rows)


def rows_per_chunk(batch: int, chunk_rows: int) -> int:
  """Rows per chunk: ``chunk_rows``, or all ``batch`` rows at once when it is 0 or does not
  divide them."""
  return chunk_rows if chunk_rows and batch % chunk_rows == 0 else batch


def behaviour_forward(params, inputs, *, model_config, completion_start, row_sharding=None):
  """The behaviour pass's forward (`logprobs.completion_hidden`, no head) of ``inputs``:
  hidden_BTD [B, T, D]."""
  hidden_BTD, _ = logprobs.completion_hidden(params, model_config, inputs['tokens_BL'],
                                             inputs['input_mask_BL'],
                                             completion_start=completion_start,
                                             row_sharding=row_sharding,
                                             replay_BLYW=inputs.get('replay_BLYW'))
  return hidden_BTD


def to_chunks(x_B: Array, n: int) -> Array:
  """[B, ...] -> [n, B / n, ...]: chunk i holds the rows {r n + i} (a local transpose of rows
  split in contiguous blocks)."""
  return jnp.moveaxis(x_B.reshape(x_B.shape[0] // n, n, *x_B.shape[1:]), 1, 0)


def from_chunks(x_nB: Array) -> Array:
  """The inverse of `to_chunks`: [n, B / n, ...] -> [B, ...] in row order."""
  return jnp.moveaxis(x_nB, 0, 1).reshape(-1, *x_nB.shape[2:])


def proxy_pass(hidden: RecomputedHidden, pass_fn: Callable, per_row: dict, *, num_seg: int,
               constrain: Callable = lambda x: x) -> dict:
  """One pass of `delta_geometry.proxy_pass` over every chunk of rows, each chunk's hidden states
  recomputed: ``pass_fn(hidden_BTD, rows) -> {'proj_UZ'?, 'sums_IZD'?, 'sq_U'?}`` of one chunk
  (``rows``: the chunk's rows of ``per_row``, a dict of [B, ...] arrays or None). Returns the
  pass's outputs for all B rows: per-token ones in row order, sums added over the chunks."""
  n = hidden.num_chunks
  rows = {'inputs': hidden.inputs, **per_row}
  xs = jax.tree.map(lambda x: to_chunks(constrain(x), n), rows)

  def body(sums_IZD, x_B):
    x_B = constrain(x_B)
    hidden_BTD = constrain(hidden.forward(hidden.params, x_B['inputs']))
    out = pass_fn(hidden_BTD, {k: v for k, v in x_B.items() if k != 'inputs'})
    per_token = {
        k: v.reshape(hidden_BTD.shape[0], -1, *v.shape[1:])
        for k, v in out.items()
        if k != 'sums_IZD'
    }
    if 'sums_IZD' in out:
      sums_IZD = sums_IZD + out['sums_IZD']
    return sums_IZD, constrain(per_token)

  init = jnp.zeros((num_seg, 2, hidden.dim), jnp.float32)
  sums_IZD, per_token_nB = jax.lax.scan(body, init, xs)
  out = {k: constrain(from_chunks(v)).reshape(-1, *v.shape[3:]) for k, v in per_token_nB.items()}
  if 'weight_BT' in per_row and per_row['weight_BT'] is not None:
    out['sums_IZD'] = sums_IZD
  return out
