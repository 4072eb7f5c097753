"""`jtc ledger import`: another framework's dumped rollouts as a jtc ledger that `jtc ledger`,
replay and the viewer open as they open jtc's own (`jtc.analysis.ledger`).

  jtc ledger import --from {prime-rl,slime,verl,jsonl} PATH --out W [--policy.checkpoint HF_DIR]
                    [--objectives a,b,...] [--hparams k=v,...]

One reader per format turns the dump into `jtc.interop.rollouts.Rollout` records (what each
reads, field by field, is in its module: `prime_rl`, `slime`, `verl`, `neutral`). They are laid
out as a ledger step ``W/ledger/<step>/`` with one point:
  * 'trainer' when the dump holds the trainer's log-probs and the behaviour policy's (prime-rl,
    the neutral schema with ``logps``): the ratio is exp(logps - old_logps);
  * 'behaviour' otherwise (slime, verl, the neutral schema without ``logps``): the ratio is 1
    by definition, so every objective's coefficient is exact without a log-prob (it depends on
    the advantages, the mask and the aggregation only); log pi itself is recomputed from
    ``--policy.checkpoint`` (an HF Llama / Qwen2 / Qwen3 directory, `jtc.models.hf_import`)
    when given and is NaN (unavailable) otherwise.
The first of ``--objectives`` is the run's objective (meta 'loss', with ``--hparams``): its
coefficient c = d loss / d log pi per token is stored as for jtc's own runs. A dump with the
framework's own per-token coefficient keeps it as ``framework_coef_BT`` beside jtc's (and its
weight streams as ``framework_<name>_BT``); the viewer colours by either or by their difference.
With ``--policy.checkpoint`` the policy is stored with the ledger (model.json,
params_update0.msgpack), so replay also measures gradient norms, KL drift and the cosines between
objectives; without it replay reports the per-token quantities only. The source (format, path,
point, what was computed rather than read) is meta['source'].

Dimension key (docs/dimensions.md): B rows, G group size, P prompt width, T completion length,
L = P + T.
"""

import os

import numpy as np

from jtc import objectives
from jtc.analysis import ledger as ledger_lib
from jtc.interop import neutral
from jtc.interop import prime_rl
from jtc.interop import rollouts as rl
from jtc.interop import slime
from jtc.interop import verl

FORMATS = ('prime-rl', 'slime', 'verl', 'jsonl')
DEFAULT_OBJECTIVE = {'prime-rl': 'dapo', 'slime': 'grpo', 'verl': 'grpo', 'jsonl': 'grpo'}


def check_request(fmt, objective_names, hparams, *, advantage):
  """ValueError before reading anything: an unknown format, objective or advantage estimator,
  an objective a dump cannot feed (DelTA's token weights), bad hyper-parameters."""
  if fmt not in FORMATS:
    raise ValueError(f'--from {fmt!r} is not a format jtc reads; valid: {", ".join(FORMATS)}')
  if advantage not in rl.ADVANTAGES:
    raise ValueError(f'--advantage {advantage!r} is not valid; valid: {", ".join(rl.ADVANTAGES)}')
  unknown = [n for n in objective_names if n not in objectives.LOSSES]
  if unknown or not objective_names:
    raise ValueError(f'unknown objective(s) {unknown or objective_names}; valid: '
                     f'{sorted(objectives.LOSSES)}')
  for n in objective_names:
    if objectives.LOSSES[n].token_weighted:
      raise ValueError(f'objective {n!r} needs DelTA\'s per-token weights, which no dump holds')
  objectives.check_hparams(objective_names[0], hparams)
  if hparams.get('entropy_coef', 0.0):
    raise ValueError('--hparams entropy_coef: the ledger\'s coefficients leave the entropy bonus '
                     'out (it is not a function of the sampled tokens\' log-probs)')


def load_tokenizer(path):
  """The HF tokenizer in directory ``path`` (None: none)."""
  if path is None:
    return None
  from jtc.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  if not os.path.isfile(os.path.join(path, 'tokenizer.json')):
    raise ValueError(f'{path}: no tokenizer.json (--tokenizer / --policy.checkpoint name an HF '
                     'directory with the run\'s tokenizer)')
  return tokenizer_lib.HFTokenizer.from_dir(path)


def read_dump(fmt, path, *, tokenizer=None, step=None, advantage='grpo', reward_key=None,
              framework_hparams=None):
  """(rollouts, source) of the dump at ``path`` in format ``fmt``."""
  if fmt == 'prime-rl':
    return prime_rl.read(path, framework_hparams=framework_hparams)
  if fmt == 'slime':
    return slime.read(path, reward_key=reward_key, advantage=advantage)
  if fmt == 'verl':
    return verl.read(path, tokenizer=tokenizer, advantage=advantage)
  return neutral.read(path, step=step, advantage=advantage)


def checkpoint_logps(checkpoint, cols):
  """[B, T] log pi of every completion token under the HF checkpoint (jtc's decoder), NaN on
  padding rows' tokens, and (model_config, params)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jtc.models import hf_import  # pylint: disable=import-outside-toplevel
  from jtc.models import logprobs  # pylint: disable=import-outside-toplevel
  config, params = hf_import.load_hf_checkpoint(checkpoint)
  tokens_BL = np.concatenate([cols['prompt_BP'], cols['completion_BT']], axis=1)
  input_mask_BL = np.concatenate([cols['prompt_mask_BP'], cols['completion_mask_BT']], axis=1)
  vocab = config.vocab_size
  if tokens_BL.max() >= vocab:
    raise ValueError(f'--policy.checkpoint {checkpoint}: token id {int(tokens_BL.max())} is not '
                     f'in its vocabulary of {vocab}: not the run\'s policy')
  logps_BT = np.asarray(
      logprobs.sequence_logprobs(params, config, jnp.asarray(tokens_BL), jnp.asarray(input_mask_BL),
                                 completion_start=cols['prompt_BP'].shape[1])['logps'], np.float32)
  return np.where(cols['completion_mask_BT'] > 0, logps_BT, 0.0), config, params


def point_columns(cols, G, *, point, loss_name, loss_hparams):
  """The ledger columns of the one point (`ledger.token_ledger`), with the log-probs the dump
  has: at 'behaviour' log pi = old log pi (ratio 1), 0 standing in where both are unknown (the
  coefficients depend on their difference only)."""
  real_BT = cols['completion_mask_BT'] > 0
  old_BT = cols['old_logps_BT']
  logps_BT = cols['logps_BT'] if point == 'trainer' else old_BT
  unknown_BT = real_BT & np.isnan(logps_BT)
  old_in = np.where(unknown_BT | ~real_BT, 0.0, old_BT).astype(np.float32)
  logps_in = np.where(unknown_BT | ~real_BT, 0.0, logps_BT).astype(np.float32)
  tokens_BL = np.concatenate([cols['prompt_BP'], cols['completion_BT']], axis=1)
  input_mask_BL = np.concatenate([cols['prompt_mask_BP'], cols['completion_mask_BT']], axis=1)
  out = ledger_lib.token_ledger(logps_in, tokens_BL=tokens_BL, input_mask_BL=input_mask_BL,
                                old_logps_BT=old_in, advantages_B=cols['advantages_B'],
                                mask_BT=cols['mask_BT'], group_size=G,
                                completion_start=cols['prompt_BP'].shape[1], loss_name=loss_name,
                                loss_hparams=loss_hparams, ref_logps_BT=cols.get('ref_logps_BT'))
  out = {k: np.asarray(v) for k, v in out.items()}
  out['logps'] = np.where(real_BT, logps_BT, 0.0).astype(np.float32)  # NaN stays: unavailable
  return out


def _vocab(cols, tokenizer):
  ids = np.unique(np.concatenate([cols['prompt_BP'].ravel(), cols['completion_BT'].ravel()]))
  if tokenizer is None:
    return {}
  return {str(int(i)): tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids}


def build(rollouts, source, *, objective, hparams, checkpoint=None, tokenizer=None):
  """(columns, meta, (model_config, params) or None): the ledger of ``rollouts``."""
  rows, G = rl.arrange(rollouts)
  cols = rl.arrays(rows)
  point = source['point']
  model = None
  if checkpoint is not None:
    logps_BT, config, params = checkpoint_logps(checkpoint, cols)
    model = (config, params)
    if point == 'behaviour':
      cols['old_logps_BT'] = cols['logps_BT'] = logps_BT
    else:
      cols['checkpoint_logps_BT'] = logps_BT
  kl = hparams.get('kl_coef', 0.0)
  if kl and 'ref_logps_BT' not in cols:
    raise ValueError(f'--hparams kl_coef={kl}: the dump has no reference log-probs (ref_logps)')
  result = point_columns(cols, G, point=point, loss_name=objective, loss_hparams=hparams)
  columns = {k: v for k, v in cols.items() if k != 'logps_BT'}
  columns['shared_BT'] = result.pop('shared')
  columns[f'gated_{point}_B'] = result.pop('gated')
  columns.update({f'{k}_{point}_BT': v for k, v in result.items()})
  real_BT = cols['completion_mask_BT'] > 0
  mismatch_BT = np.where(real_BT, columns[f'logps_{point}_BT'] - cols['sampler_logps_BT'], 0.0)
  if point == 'behaviour' and not np.isnan(mismatch_BT[real_BT]).all():
    columns['mismatch_BT'] = mismatch_BT
  padded = [b for b, r in enumerate(rows) if r is None]
  step = next(r.step for r in rows if r is not None)
  meta = dict(
      step=step, loss=objective, loss_hparams=dict(hparams), group_size=G,
      completion_start=int(cols['prompt_BP'].shape[1]), learning_rate=None, points=[point],
      updates=[list(range(len(rows)))], vocab=_vocab(cols, tokenizer),
      texts=['' if r is None else r.completion_text or '' for r in rows], source=dict(
          source, rows=len(rollouts), padded_rows=padded,
          where=[None if r is None else r.where for r in rows],
          logps='checkpoint' if checkpoint else ('dump' if point == 'trainer' else 'unavailable'),
          checkpoint=checkpoint))
  return columns, meta, model


def ledger_path(out, step):
  return os.path.join(out, ledger_lib.LEDGER_DIR, str(step))


def write(out, columns, meta, model, *, overwrite=False):
  """Writes the ledger step under ``out`` (a workdir-like directory); ValueError if that step
  exists and not ``overwrite``. Returns its path."""
  path = ledger_path(out, meta['step'])
  if os.path.exists(path) and not overwrite:
    raise ValueError(f'{path} exists; pass --overwrite to replace it')
  os.makedirs(os.path.join(out, ledger_lib.LEDGER_DIR), exist_ok=True)
  config, params = model if model is not None else (None, None)
  return ledger_lib.write(path, columns=columns, meta=meta, model_config=config,
                          params_by_update={} if params is None else {0: params})


def summary(meta, columns):
  """One line: what was imported and what is unavailable."""
  B = len(columns['advantages_B'])
  src = meta['source']
  parts = [
      f'{src["format"]} step {meta["step"]}: {src["rows"]} completions in '
      f'{B // meta["group_size"]} groups of {meta["group_size"]}', f'point {meta["points"][0]}',
      f'objective {meta["loss"]}', f'log pi: {src["logps"]}'
  ]
  if src['padded_rows']:
    parts.append(f'{len(src["padded_rows"])} empty rows pad the smaller groups')
  if 'framework_coef_BT' in columns:
    parts.append('framework coefficient kept beside jtc\'s')
  if np.isnan(columns['rewards_B']).all():
    parts.append('rewards: not in the dump')
  return '; '.join(parts)
