"""The trainer's side of the per-token ledger (`jtc.analysis.ledger`): at a ledger step it keeps
the parameters before each update of the first epoch, computes the ledger columns of the run's
objective at the behaviour policy and before the second update, and writes one ledger directory
per member. Nothing of this runs at other steps (`log.ledger_every` = 0: none at all).

Dimension key (docs/dimensions.md): B rows, T completion length, L = P + T."""

import os

import jax
import numpy as np

from jtc.analysis import ledger as ledger_lib
from jtc.models import logprobs
from jtc.rl import routing
from jtc.rl import sharding as sharding_lib


def make_columns_fn(c, model_config, population):
  """The jitted (params, batch) -> ledger columns of the config's loss, mapped over members."""

  def columns(params, batch):
    out = logprobs.sequence_logprobs(params, model_config, batch.tokens_BL, batch.input_mask_BL,
                                     completion_start=c.data.prompt_width,
                                     replay_BLYW=batch.replay_BLYW)
    cols = ledger_lib.token_ledger(
        out['logps'], tokens_BL=batch.tokens_BL, input_mask_BL=batch.input_mask_BL,
        old_logps_BT=batch.old_logps_BT, advantages_B=batch.advantages_B, mask_BT=batch.mask_BT,
        group_size=c.rollout.sampling.num_samples, completion_start=c.data.prompt_width,
        loss_name=c.loss.name, loss_hparams=c.loss.hparams.to_dict(),
        token_weights_BT=batch.token_weights_BT, ref_logps_BT=batch.ref_logps_BT,
        is_weights_BT=batch.is_weights_BT)
    if 'experts' in out:  # a MoE policy's own routing, for the routing-flip column
      cols['experts'] = out['experts']
    return cols

  return jax.jit(population.map(columns))


class LedgerRecorder:
  """One ledger step: `before_update` is `update.run_updates`'s hook; `write` saves it."""

  def __init__(self, columns_fn, batch, population):
    self.columns_fn, self.batch, self.pop = columns_fn, batch, population
    self.params, self.rows, self.points = {}, {}, {}

  def before_update(self, k, params, rows, stored=None):
    """Keeps the parameters before update k (on the host; ``stored`` instead when given, e.g. a
    LoRA policy's merged weights) and its rows; at k = 0 and k = 1 the ledger columns of the
    whole batch (the behaviour policy; the first off-policy point)."""
    self.params[k] = sharding_lib.to_host(params if stored is None else stored)
    self.rows[k] = np.asarray(rows)
    if k < len(ledger_lib.POINTS):
      self.points[ledger_lib.POINTS[k]] = sharding_lib.to_host(self.columns_fn(params, self.batch))

  def write(self, step, *, run_dirs, rollouts, tokenizer, c, model_config, learning_rates,
            files=True):
    """One ledger directory per member (``run_dirs``), from its rollouts and columns. Every
    process of a multi-process run calls it (the batch is gathered); ``files``: this one writes."""
    batch = sharding_lib.to_host(self.batch)
    if not files:
      return
    for m, (path, rollout) in enumerate(zip(run_dirs, rollouts)):
      member = lambda tree, m=m: self.pop.unstack(tree)[m]
      columns = {
          'completion_BT': rollout.completion_BT,
          'completion_mask_BT': rollout.completion_mask_BT,
          'truncated_B': rollout.truncated_B,
          'rewards_B': rollout.rewards_B,
          'sampler_logps_BT': rollout.sampler_logps_BT,
          'prompt_BP': rollout.tokens_BL[:, :c.data.prompt_width],
          'prompt_mask_BP': rollout.input_mask_BL[:, :c.data.prompt_width],
          'mask_BT': member(batch.mask_BT),
          'advantages_B': member(batch.advantages_B),
          'old_logps_BT': member(batch.old_logps_BT)
      }
      if batch.token_weights_BT is not None:
        columns['token_weights_BT'] = member(batch.token_weights_BT)
      if batch.ref_logps_BT is not None:
        columns['ref_logps_BT'] = member(batch.ref_logps_BT)
      if batch.is_weights_BT is not None:
        columns['is_weights_BT'] = member(batch.is_weights_BT)
      for point, cols in self.points.items():
        cols = member(cols)
        if point == 'behaviour' and rollout.experts_BLYW is not None:  # a MoE run's (`routing`)
          columns['routing_flip_BT'] = np.asarray(
              routing.token_flips(rollout.experts_BLYW[:, c.data.prompt_width:],
                                  cols.pop('experts'), rollout.completion_mask_BT))
        cols.pop('experts', None)
        columns['shared_BT'] = cols['shared']
        if point == 'behaviour':
          columns['mismatch_BT'] = np.where(columns['completion_mask_BT'] > 0,
                                            cols['logps'] - rollout.sampler_logps_BT, 0.0)
        columns[f'gated_{point}_B'] = cols['gated']
        columns.update({
            f'{k}_{point}_BT': v for k, v in cols.items() if k not in ('gated', 'shared')
        })
      ids = np.unique(np.concatenate([rollout.completion_BT.ravel(), rollout.tokens_BL.ravel()]))
      meta = dict(
          step=step, loss=c.loss.name, loss_hparams=c.loss.hparams.to_dict(),
          group_size=c.rollout.sampling.num_samples, completion_start=c.data.prompt_width,
          learning_rate=learning_rates[m], points=list(self.points), updates=[
              self.rows[k].tolist() if not self.pop.batched else self.rows[k][m].tolist()
              for k in sorted(self.rows)
          ], vocab={str(int(i)): tokenizer.decode([int(i)]) for i in ids}, texts=list(rollout.texts))
      params = {k: member(p) for k, p in self.params.items()}
      ledger_lib.write(os.path.join(path, ledger_lib.LEDGER_DIR, str(step)), columns=columns,
                       meta=meta, model_config=model_config, params_by_update=params)
