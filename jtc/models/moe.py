"""The mixture-of-experts feed-forward of a decoder layer (Qwen3-MoE; the shared expert with its
sigmoid gate of Qwen3-Next / Qwen3.5-MoE), as pure functions of one layer's parameters.

A router picks W of X experts for every token and mixes their SwiGLU outputs; every token
reaches all of its W experts (dropless: no capacity, nothing dropped):

  probs_X = softmax(x R)                          (float32; R the router [D, X])
  S = the W experts of largest probs_X            (or the replayed ones, `route`)
  w_j = probs_j, / sum_{i in S} probs_i if norm_topk_prob
  y = sum_{j in S} w_j down_j(silu(gate_j x) * up_j x)  [+ sigmoid(x g) shared(x)]

The experts' weights are stacked: gate / up [X, D, F], down [X, F, D]. `MOE_IMPLS` computes the
sum three exact ways: 'ragged' sorts the U * W (token, expert) pairs by expert and runs grouped
matmuls (`jax.lax.ragged_dot`, the grouped GEMM of GPU/TPU; the pairs of an expert are one group;
XLA:CPU lowers it as a masked dense product over every group), 'blocks' sorts them likewise into
blocks of one expert each and runs one batched matmul against the blocks' gathered weights (the
fast one on a CPU; it also trains under `jax.vmap`, which `ragged_dot`'s weight gradient does
not), 'dense' runs every expert on every token and weighs the outputs by w (0 off S): X / W
times the FLOPs, the simplest, a reference.

The load-balancing auxiliary loss of Switch Transformer (Fedus et al. 2021, Eqs. 4-6) as
Hugging Face's ``load_balancing_loss_func`` defines it (`load_balancing_loss`): the fraction of
routed choices f_x and the mean router probability P_x of each expert, pooled over the layers
and the real tokens, give X * sum_x f_x P_x (W when perfectly balanced; f counts the router's own
top-W, not replayed experts, and carries no gradient).

A layer's parameters (`init_ffn`; under 'layers' each leaf gets the stacked [Y, ...] axis):
  {'router': {'kernel': [D, X]},
   'expert_gate': {'kernel': [X, D, F]}, 'expert_up': {'kernel': [X, D, F]},
   'expert_down': {'kernel': [X, F, D]},
   'shared': {'gate': {'kernel': [D, F]}, 'up': {...}, 'down': {'kernel': [F, D]}},  # iff
   'shared_gate': {'kernel': [D, 1]}}                               # d_shared_expert > 0
(F is `ModelConfig.d_expert` for the routed experts and `d_shared_expert` for the shared one.)

Dimension key (docs/dimensions.md): B batch, L tokens, U = B * L tokens flattened, D model dim,
F an expert's MLP dim, X experts, W experts per token, Y layers.
"""

import functools
import math

import chex
import flax
import jax
import jax.numpy as jnp

from jtc.models import moe_dispatch
from jtc.models.model_config import ModelConfig

# Logical axes of the MoE parameters (`jtc.models.model.param_logical_axes`, by the last two
# path keys). The router and the shared expert's gate are small and never split over experts.
PARAM_AXES = {
    ('router', 'kernel'): ('embed', None),
    ('expert_gate', 'kernel'): ('experts', 'embed', 'mlp'),
    ('expert_up', 'kernel'): ('experts', 'embed', 'mlp'),
    ('expert_down', 'kernel'): ('experts', 'mlp', 'embed'),
    ('shared_gate', 'kernel'): ('embed', None),
}


@flax.struct.dataclass
class Routed:
  """One MoE layer's routing of a [B, L] call (stacked on a leading [Y] axis by the trunk).

  experts_BLW: int32, the W experts the router itself ranks highest (largest probability first),
    whether or not a replay replaced them: what the mismatch instruments compare.
  load_X: float32, the counted tokens' choices of each expert by that top-W (sums to W n).
  prob_X: float32, the router probabilities summed over the counted tokens (sums to n).
  """
  experts_BLW: jax.Array
  load_X: jax.Array
  prob_X: jax.Array


def _normal(key, shape, fan_in, dtype):
  return jax.random.normal(key, shape, dtype) * jnp.asarray(1.0 / math.sqrt(fan_in), dtype)


def init_ffn(config: ModelConfig, key) -> dict:
  """One layer's MoE parameters (no layer axis): kernels ~ N(0, 1/fan_in)."""
  c = config
  X, D, F, Fs = c.n_experts, c.d_model, c.d_expert, c.d_shared_expert
  dt = c.jnp_param_dtype
  keys = jax.random.split(key, 8)
  p = {
      'router': {
          'kernel': _normal(keys[0], (D, X), D, dt)
      },
      'expert_gate': {
          'kernel': _normal(keys[1], (X, D, F), D, dt)
      },
      'expert_up': {
          'kernel': _normal(keys[2], (X, D, F), D, dt)
      },
      'expert_down': {
          'kernel': _normal(keys[3], (X, F, D), F, dt)
      },
  }
  if Fs:
    p['shared'] = {
        'gate': {
            'kernel': _normal(keys[4], (D, Fs), D, dt)
        },
        'up': {
            'kernel': _normal(keys[5], (D, Fs), D, dt)
        },
        'down': {
            'kernel': _normal(keys[6], (Fs, D), Fs, dt)
        }
    }
    p['shared_gate'] = {'kernel': _normal(keys[7], (D, 1), D, dt)}
  return p


def route(router_DX, x_BLD, *, experts_per_token: int, norm_topk_prob: bool, replay_BLW=None):
  """The router: (experts_BLW used, weights_BLW float32, own top-W experts_BLW, probs_BLX f32).

  The logits x R are computed in float32 whatever the compute dtype. ``replay_BLW`` (int, or
  None): experts to use instead of the router's choice for every token whose first entry is
  >= 0 (-1: the router decides); their weights are still the router's probabilities (so its
  gradient flows through the chosen experts, as routing replay, R3, does)."""
  W = experts_per_token
  logits_BLX = jnp.einsum('BLD,DX->BLX', x_BLD.astype(jnp.float32), router_DX.astype(jnp.float32))
  probs_BLX = jax.nn.softmax(logits_BLX, axis=-1)
  _, own_BLW = jax.lax.top_k(probs_BLX, W)
  experts_BLW = own_BLW
  if replay_BLW is not None:
    chex.assert_equal_shape([replay_BLW, own_BLW])
    experts_BLW = jnp.where(replay_BLW[..., :1] >= 0, replay_BLW.astype(own_BLW.dtype), own_BLW)
  # In ascending expert order: the same set of experts, replayed or chosen, is then the same
  # arithmetic (a replay is bit-identical to the router's choice wherever the sets agree).
  experts_BLW = jnp.sort(experts_BLW, axis=-1)
  weights_BLW = jnp.take_along_axis(probs_BLX, experts_BLW, axis=-1)
  if norm_topk_prob:
    weights_BLW = weights_BLW / jnp.sum(weights_BLW, axis=-1, keepdims=True)
  return experts_BLW, weights_BLW, own_BLW, probs_BLX


def _swiglu(x_UD, gate_DF, up_DF, down_FD, dtype):
  h_UF = jax.nn.silu(x_UD @ gate_DF.astype(dtype)) * (x_UD @ up_DF.astype(dtype))
  return h_UF @ down_FD.astype(dtype)


def _experts_ragged(p, x_UD, experts_UW, weights_UW, dtype):
  """sum_j w_j expert_j(x): the U * W (token, expert) pairs sorted by expert (stable), one
  grouped matmul per projection over the X groups, then gathered back and mixed."""
  U, W = experts_UW.shape
  X = p['expert_gate']['kernel'].shape[0]
  expert_of_pair = experts_UW.reshape(-1)  # [U * W], pair u * W + j
  order = jnp.argsort(expert_of_pair, stable=True)  # pairs grouped by expert
  sizes_X = jnp.bincount(expert_of_pair, length=X).astype(jnp.int32)
  x_sorted = jnp.take(x_UD, order // W, axis=0)  # [U * W, D]
  grouped = lambda a, name: jax.lax.ragged_dot(a, p[name]['kernel'].astype(dtype), sizes_X)
  h_sorted = jax.nn.silu(grouped(x_sorted, 'expert_gate')) * grouped(x_sorted, 'expert_up')
  y_sorted = grouped(h_sorted, 'expert_down')  # [U * W, D]
  y_UWD = jnp.take(y_sorted, jnp.argsort(order), axis=0).reshape(U, W, -1)
  return jnp.einsum('UWD,UW->UD', y_UWD, weights_UW.astype(dtype))


def _experts_dense(p, x_UD, experts_UW, weights_UW, dtype):
  """sum_j w_j expert_j(x) with every expert on every token: each pair's output picked out of the
  X outputs by a one-hot sum (exact: one non-zero term), then mixed over W. Split over a mesh's
  expert axis, the pick becomes a sum across devices that is still exact, so the result does not
  depend on the split."""
  X = p['expert_gate']['kernel'].shape[0]
  kernel = lambda name: p[name]['kernel'].astype(dtype)
  h_XUF = jax.nn.silu(jnp.einsum('UD,XDF->XUF', x_UD, kernel('expert_gate'))) * jnp.einsum(
      'UD,XDF->XUF', x_UD, kernel('expert_up'))
  y_XUD = jnp.einsum('XUF,XFD->XUD', h_XUF, kernel('expert_down'))
  y_UWD = jnp.einsum('XUD,UWX->UWD', y_XUD, jax.nn.one_hot(experts_UW, X, dtype=dtype))
  return jnp.einsum('UWD,UW->UD', y_UWD, weights_UW.astype(dtype))


def _experts_blocks(p, x_UD, experts_UW, weights_UW, dtype, block: int = 64):
  """sum_j w_j expert_j(x) with the pairs sorted by expert and each expert's pairs padded to
  whole blocks of C rows: n blocks (a static bound: U * W pairs + X * (C - 1) rows of padding at
  most), each of one expert, as one batched matmul against the blocks' gathered weights. Nothing
  is dropped; at most (1 + X C / (U W)) times the FLOPs of the chosen experts, C = ``block``, or
  the power of two below U W / X when that is smaller (a decode step's few pairs)."""
  U, W = experts_UW.shape
  X, D, F = p['expert_gate']['kernel'].shape
  n_pairs = U * W
  C = min(block, 1 << max(0, (n_pairs // X).bit_length() - 1))
  n = -(-(n_pairs + X * (C - 1)) // C)
  expert_of_pair = experts_UW.reshape(-1)
  order = jnp.argsort(expert_of_pair, stable=True)
  sizes_X = jnp.bincount(expert_of_pair, length=X)
  start_X = jnp.cumsum(sizes_X) - sizes_X  # first sorted pair of each expert
  blocks_X = -(-sizes_X // C)
  first_block_X = jnp.cumsum(blocks_X) - blocks_X
  # Block j belongs to the last expert whose first block is <= j (experts without pairs own
  # none); its row c is that expert's pair (j - first block) * C + c, if it has one.
  expert_n = jnp.clip(jnp.searchsorted(first_block_X, jnp.arange(n), side='right') - 1, 0, X - 1)
  rank_nC = (jnp.arange(n) - first_block_X[expert_n])[:, None] * C + jnp.arange(C)
  real_nC = (rank_nC < sizes_X[expert_n][:, None]) & (jnp.arange(n) < jnp.sum(blocks_X))[:, None]
  sorted_nC = jnp.where(real_nC, start_X[expert_n][:, None] + rank_nC, 0)
  x_nCD = jnp.take(x_UD, jnp.take(order, sorted_nC) // W, axis=0)
  kernel = lambda name: jnp.take(p[name]['kernel'].astype(dtype), expert_n, axis=0)
  h_nCF = jax.nn.silu(jnp.einsum('nCD,nDF->nCF', x_nCD, kernel('expert_gate'))) * jnp.einsum(
      'nCD,nDF->nCF', x_nCD, kernel('expert_up'))
  y_nCD = jnp.einsum('nCF,nFD->nCD', h_nCF, kernel('expert_down'))
  # Back to the pairs: sorted pair i sits in block first_block + rank // C, row rank % C.
  rank = jnp.arange(n_pairs) - start_X[jnp.take(expert_of_pair, order)]
  block_of = first_block_X[jnp.take(expert_of_pair, order)] + rank // C
  y_sorted = y_nCD[block_of, rank % C]  # [U * W, D]
  y_UWD = jnp.take(y_sorted, jnp.argsort(order), axis=0).reshape(U, W, D)
  return jnp.einsum('UWD,UW->UD', y_UWD, weights_UW.astype(dtype))


MOE_IMPLS = {'ragged': _experts_ragged, 'dense': _experts_dense, 'blocks': _experts_blocks}

# The mesh axes the rows of a batch split over (`jtc.rl.sharding`: 'data' and 'fsdp').
ROW_AXES = ('data', 'fsdp')

# The model axis D of each expert weight ([X, D, F] and [X, F, D]), split over 'fsdp' ('embed').
EXPERT_D_AXIS = {'expert_gate': 1, 'expert_up': 1, 'expert_down': 2}


def _experts_BLD(experts_fn, p, x_BLD, experts_BLW, weights_BLW, dtype, gather=()):
  """``experts_fn`` over the B x L tokens flattened: y [B, L, D]; ``gather``: the weights whose
  model axis is split over 'fsdp' here, all-gathered first (inside `rows_local`)."""
  B, L, D = x_BLD.shape
  W = experts_BLW.shape[-1]
  gathered = lambda k: jax.lax.all_gather(p[k]['kernel'], 'fsdp', axis=EXPERT_D_AXIS[k], tiled=True)
  p = {**p, **{k: {'kernel': gathered(k)} for k in gather}}
  y_UD = experts_fn(p, x_BLD.reshape(B * L, D), experts_BLW.reshape(B * L, W),
                    weights_BLW.reshape(B * L, W), dtype)
  return y_UD.reshape(B, L, D)


def rows_local(experts_fn, p, x_BLD, experts_BLW, weights_BLW, dtype):
  """``experts_fn`` (one of `MOE_IMPLS`) on the rows of each shard of the batch, y [B, L, D].

  The sorted forms order the (token, expert) pairs by expert with one `argsort` over the pair
  axis; with the rows split over the mesh's batch axes (`ROW_AXES`), XLA cannot split a sort
  along the axis it sorts, so it gathers every chip's pairs and each chip sorts, gathers and
  runs the pairs of the whole batch (measured for Qwen3-30B-A3B's experts on TPU: per-chip
  temporaries grow with the global token count, docs/scaling.md). Under an abstract mesh in
  context (`jtc.models.model.hidden_states` sets the rows' mesh) whose batch axes split B,
  each shard sorts and runs its own rows (`jax.shard_map`, manual over those axes only, the
  other axes left to XLA): the experts' weights enter split over 'fsdp' along D as they are
  stored and are all-gathered inside (FSDP: their gradient leaves reduce-scattered), the same
  pairs and the same per-pair arithmetic, so the same values. Any other ``experts_fn``
  ('dense': no sort), no mesh, a population's mesh or a B the shards do not divide: one call
  over all rows."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = () if mesh.empty else tuple(a for a in ROW_AXES if mesh.shape.get(a, 1) > 1)
  shards = math.prod(mesh.shape[a] for a in axes) if axes else 1
  if (experts_fn not in (_experts_ragged, _experts_blocks) or shards == 1 or
      x_BLD.shape[0] % shards or mesh.shape.get('population', 1) > 1):
    return _experts_BLD(experts_fn, p, x_BLD, experts_BLW, weights_BLW, dtype)
  P = jax.sharding.PartitionSpec
  experts_p = {k: p[k] for k in EXPERT_D_AXIS}
  gather = tuple(k for k, a in EXPERT_D_AXIS.items()
                 if 'fsdp' in axes and experts_p[k]['kernel'].shape[a] % mesh.shape['fsdp'] == 0)
  specs = {
      k: {
          'kernel': P(*[None] * a, 'fsdp') if k in gather else P()
      } for k, a in EXPERT_D_AXIS.items()
  }
  rows = P(axes)
  local = functools.partial(_experts_BLD, experts_fn, dtype=dtype, gather=gather)
  # check_vma off: the blocks form's searchsorted has no rule for varying axes; the weights'
  # gradient is still summed over the shards (tested).
  return jax.shard_map(local, mesh=mesh, in_specs=(specs, rows, rows, rows), out_specs=rows,
                       axis_names=frozenset(axes), check_vma=False)(experts_p, x_BLD, experts_BLW,
                                                                    weights_BLW)


def feed_forward(p, x_BLD, config: ModelConfig, *, mask_BL=None, replay_BLW=None):
  """The MoE block on normed inputs x [B, L, D]: (y_BLD in the compute dtype, `Routed`).

  ``mask_BL``: the tokens the load statistics count (None: all); ``replay_BLW``: as `route`."""
  c = config
  B, L, D = x_BLD.shape
  chex.assert_shape(p['router']['kernel'], (D, c.n_experts))
  dt = c.jnp_dtype
  x_BLD = x_BLD.astype(dt)
  experts_BLW, weights_BLW, own_BLW, probs_BLX = route(p['router']['kernel'], x_BLD,
                                                       experts_per_token=c.experts_per_token,
                                                       norm_topk_prob=c.norm_topk_prob,
                                                       replay_BLW=replay_BLW)
  experts_fn = MOE_IMPLS[c.moe_impl]
  if c.moe_dispatch == 'all_to_all':  # expert parallelism: the tokens sent to their experts
    experts_fn = functools.partial(moe_dispatch.exchange, experts_fn)
  y_BLD = rows_local(experts_fn, p, x_BLD, experts_BLW, weights_BLW, dt)
  if 'shared' in p:
    s = p['shared']
    shared_UD = _swiglu(x_BLD.reshape(B * L, D), s['gate']['kernel'], s['up']['kernel'],
                        s['down']['kernel'], dt)
    gate_BL1 = jax.nn.sigmoid(x_BLD @ p['shared_gate']['kernel'].astype(dt))
    y_BLD = y_BLD + gate_BL1 * shared_UD.reshape(B, L, D)
  count_BL = jnp.ones((B, L), jnp.float32) if mask_BL is None else mask_BL.astype(jnp.float32)
  load_X = jnp.einsum('BLWX,BL->X', jax.nn.one_hot(own_BLW, c.n_experts, dtype=jnp.float32),
                      count_BL)
  prob_X = jnp.einsum('BLX,BL->X', probs_BLX, count_BL)
  return y_BLD, Routed(experts_BLW=own_BLW, load_X=load_X, prob_X=prob_X)


def load_balancing_loss(routed: Routed, mask_BL):
  """X * sum_x f_x P_x over the layers of ``routed`` (leaves [Y, ...]) and the real tokens of
  ``mask_BL``, f_x = load_x / (Y n) and P_x = prob_x / (Y n) (n real tokens): Hugging Face's
  ``load_balancing_loss_func`` with an attention mask (Switch Transformer Eqs. 4-6). Gradient
  through P only (the top-W counts are piecewise constant). A float32 scalar."""
  Y, X = routed.load_X.shape
  rows = Y * jnp.maximum(jnp.sum(mask_BL.astype(jnp.float32)), 1.0)
  f_X = jnp.sum(routed.load_X, axis=0) / rows
  P_X = jnp.sum(routed.prob_X, axis=0) / rows
  return X * jnp.sum(f_X * P_X)
