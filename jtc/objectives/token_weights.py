"""Plug-ins that produce per-token loss weights for the trainer, and their token clouds.

A plug-in is chosen by `config.token_weights` (``PLUGINS``); the trainer calls
``weights(state, params, behaviour, inputs, completion_BT, adv_B, mask_BT, rng) -> (weights_BT,
metrics, state)`` once per rollout batch with the behaviour pass's outputs (log-probs, hidden
states when ``needs_hidden``) and inputs (tokens, masks, replayed experts), and
checkpoints ``state`` with the run. `DeltaWeighter` is DelTA (arXiv 2605.21467): the
coefficients of `jtc.objectives.delta.token_coefficients` and the running token cloud (Figure 4).

Dimension key (docs/dimensions.md): B batch, T completion length, V vocabulary, U = B * T
flattened tokens.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jtc.objectives import delta
from jtc.objectives import delta_recompute
from jtc.models import model as model_lib

Array = jax.Array

# ----------------------------------------------------------------------------------
# Token clouds (DelTA Figure 4): per-vocabulary-id mean lam across steps.
# ----------------------------------------------------------------------------------


@flax.struct.dataclass
class TokenCloudState:
  """Running per-vocabulary-id sums of lam and token counts.

    Attributes: lam_sum_V [V] float32; count_V [V] float32.
    """
  lam_sum_V: Array
  count_V: Array

  @property
  def mean_V(self) -> Array:
    """Mean lam per vocabulary id (0 where never seen)."""
    return self.lam_sum_V / jnp.maximum(self.count_V, 1.0)


def init_token_cloud(vocab_size: int) -> TokenCloudState:
  """Empty accumulator over a vocabulary of ``vocab_size`` ids."""
  return TokenCloudState(lam_sum_V=jnp.zeros((vocab_size,), jnp.float32), count_V=jnp.zeros(
      (vocab_size,), jnp.float32))


def update_token_cloud(state: TokenCloudState, token_ids_BT: Array, lam_BT: Array,
                       mask_BT: Array) -> TokenCloudState:
  """Adds lam of every masked-in token to its vocabulary id (jit-able).

    Pass e.g. ``mask_BT & (advantages_B[:, None] != 0)`` to count scored tokens only.
    """
  chex.assert_rank([token_ids_BT, lam_BT, mask_BT], 2)
  chex.assert_equal_shape([token_ids_BT, lam_BT, mask_BT])
  on_U = (mask_BT > 0).reshape(-1).astype(jnp.float32)
  ids_U = token_ids_BT.reshape(-1)
  lam_U = lam_BT.reshape(-1).astype(jnp.float32)
  return TokenCloudState(lam_sum_V=state.lam_sum_V.at[ids_U].add(on_U * lam_U),
                         count_V=state.count_V.at[ids_U].add(on_U))


def top_bottom_tokens(state: TokenCloudState, k: int, *, min_count: float = 1.0):
  """The k ids with the highest and the k with the lowest mean lam (Figure 4).

    Ids seen fewer than ``min_count`` times are excluded (if fewer than k are
    eligible, the tail of the result has mean +-inf and should be dropped).

    Returns: dict with 'top_ids', 'top_mean', 'bottom_ids', 'bottom_mean',
      'top_count', 'bottom_count' (each [k]).
    """
  ok_V = state.count_V >= min_count
  mean_V = state.mean_V
  top_mean, top_ids = jax.lax.top_k(jnp.where(ok_V, mean_V, -jnp.inf), k)
  neg_bottom, bottom_ids = jax.lax.top_k(jnp.where(ok_V, -mean_V, -jnp.inf), k)
  return {
      'top_ids': top_ids,
      'top_mean': top_mean,
      'top_count': state.count_V[top_ids],
      'bottom_ids': bottom_ids,
      'bottom_mean': -neg_bottom,
      'bottom_count': state.count_V[bottom_ids]
  }


# ----------------------------------------------------------------------------------
# The trainer plug-in: token weights from the behaviour pass, and the token cloud.
# ----------------------------------------------------------------------------------


class DeltaWeighter:
  """DelTA as a token-weight plug-in of the trainer.

    ``weights(state, params, behaviour, inputs, completion_BT, adv_B, mask_BT, rng)`` returns
    (lam_BT, metrics, state): the coefficients `surrogates.delta` takes as token_weights, and
    the running token cloud (DelTA Figure 4) over the tokens DelTA scores (real, A != 0). The
    cloud is the plug-in's ``state`` (arrays, checkpointed with the run).

    ``hidden`` (config.delta.hidden, `delta_recompute.HIDDEN_MODES`) says where the hidden
    states come from: 'held', the behaviour log-prob pass's (``behaviour``: the dict of
    `logprobs.sequence_logprobs` with return_hidden=True, so no extra forward pass, but the
    step's [B, T, D] states live from that pass to this one); 'recomputed', ``forward(params,
    inputs of a chunk of rows)`` (the behaviour pass's forward, ``inputs``: {'tokens_BL',
    'input_mask_BL', 'replay_BLYW'}) run again on ``chunk_rows`` rows at a time in each of
    DelTA's 2K + 2 passes (`jtc.objectives.delta_recompute`).
    """

  def __init__(self, options: delta.DeltaOptions, *, group_size: int, model_config: Any,
               row_sharding=None, hidden: str = 'held', forward=None, chunk_rows: int = 0):
    self.options = options
    self.model_config = model_config
    # row_sharding: the rows' sharding the coefficient pass keeps (`delta.token_coefficients`).
    self.row_sharding = row_sharding
    check_hidden(hidden)
    if hidden == 'recomputed' and forward is None:
      raise ValueError("config.delta.hidden='recomputed' needs the behaviour pass's forward")
    self.hidden, self.forward, self.chunk_rows = hidden, forward, chunk_rows
    self._coefficients = jax.jit(
        functools.partial(delta.token_coefficients, options=options, group_size=group_size,
                          row_sharding=row_sharding))

  @staticmethod
  def check_config(section: Any) -> delta.DeltaOptions:
    """The `DeltaOptions` of a config's `delta` section (ablation name, range, refinement,
        scope); a ValueError naming the bad key otherwise."""
    check_hidden(section.get('hidden', 'held'))
    if section.ablation not in delta.DELTA_ABLATIONS:
      raise ValueError(f'config.delta.ablation={section.ablation!r} is not valid; valid: '
                       f'{sorted(delta.DELTA_ABLATIONS)}')
    try:
      return delta.options_for(section.ablation, lam_min=section.lam_min, lam_max=section.lam_max,
                               num_refine=section.num_refine, scope=section.scope)
    except ValueError as e:
      raise ValueError(f'config.delta: {e}') from None

  @classmethod
  def from_config(cls, section: Any, *, group_size: int, model_config: Any, row_sharding=None,
                  forward=None, chunk_rows: int = 0) -> 'DeltaWeighter':
    """From a config's `delta` section (``forward``, ``chunk_rows``: for hidden='recomputed')."""
    return cls(cls.check_config(section), group_size=group_size, model_config=model_config,
               row_sharding=row_sharding, hidden=section.get('hidden', 'held'), forward=forward,
               chunk_rows=chunk_rows)

  @property
  def needs_hidden(self) -> bool:
    """Whether the behaviour pass must return its hidden states."""
    return self.hidden == 'held'

  def init_state(self) -> TokenCloudState:
    return init_token_cloud(self.model_config.vocab_size)

  def weights(self, state, params, behaviour, inputs, completion_BT, adv_B, mask_BT, rng):
    extra = {}
    if self.options.proxy == 'topk_hidden':
      extra = dict(unembed_VD=model_lib.lm_head_DV(params, self.model_config).T,
                   token_ids_BT=completion_BT)
    hidden = behaviour.get('hidden')
    if not self.needs_hidden:
      hidden = delta_recompute.RecomputedHidden(params=params, inputs=inputs, forward=self.forward,
                                                length=mask_BT.shape[1],
                                                dim=self.model_config.d_model,
                                                chunk_rows=self.chunk_rows)
    lam_BT, metrics = self._coefficients(hidden, behaviour['logps'], adv_B, mask_BT, rng=rng,
                                         **extra)
    scored_BT = mask_BT * (adv_B[:, None] != 0)
    state = update_token_cloud(state, completion_BT, lam_BT, scored_BT)
    return lam_BT, metrics, state

  def write(self, state, workdir: str, tokenizer: Any, k: int = 20) -> None:
    """`token_cloud.json`: the tokens with the highest and lowest mean lambda so far."""
    tb = jax.device_get(top_bottom_tokens(state, k, min_count=5))
    rows = {
        side: [
            dict(token=tokenizer.decode([int(i)]) or repr(int(i)), id=int(i), mean_lambda=float(m),
                 count=int(n))
            for i, m, n in zip(tb[f'{side}_ids'], tb[f'{side}_mean'], tb[f'{side}_count'])
        ] for side in ('top', 'bottom')
    }
    with open(os.path.join(workdir, 'token_cloud.json'), 'w') as f:
      json.dump(rows, f, indent=1)


def check_hidden(hidden: str) -> None:
  """A ValueError naming ``hidden`` unless it is one of `delta_recompute.HIDDEN_MODES`."""
  if hidden not in delta_recompute.HIDDEN_MODES:
    raise ValueError(f'config.delta.hidden={hidden!r} is not valid; valid: '
                     f'{list(delta_recompute.HIDDEN_MODES)}')


PLUGINS = {'delta': DeltaWeighter}
