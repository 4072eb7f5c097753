"""prime-rl's token export (`trainer.enable_token_export = true`) as `Rollout` records.

The trainer writes ``<run_dir>/token_exports/step_<step>/rank_<rank>.jsonl`` (prime-rl's
``src/prime_rl/trainer/rl/token_export.py``, schema_version 1): one JSON line per packed sequence
that has a loss token, after every micro-batch's forward pass, with the metadata keys
``schema_version, step, rank, micro_step, micro_sequence_idx, export_sequence_idx, env_name`` and
per-token lists aligned with ``token_ids`` (the whole sequence, prompt included):
``position_ids, loss_mask, advantages, inference_logprobs, trainer_logprobs, entropy,
mismatch_kl, log_importance_ratio, importance_ratio, prob_delta, is_masked, is_masked_high,
is_masked_low, rl_weights, ce_weights, ref_kl_weights``. A non-finite float, and every entry of a
stream the step did not have (no weight stream; no DPPO mask under a non-default loss), is
``null``. Log-probs are of the token at that position (the trainer shifts them right), so the
completion's are the tail of each list. A ``STABLE`` file marks a step every rank has flushed.

What jtc reads (PATH: a ``step_<n>`` directory, every ``rank_*.jsonl`` in it, or one rank file):
  prompt = the tokens before the first loss token; completion = the rest (tool or environment
  tokens inside it keep loss_mask 0: real, without gradient); the mask is the rl component's,
  loss_mask and rl_weights != 0 (prime-rl's ``compute_loss``);
  advantage = the value on the loss tokens (one per sequence; a sequence whose loss tokens carry
  different advantages is refused: jtc's objectives take one per completion);
  logps = trainer_logprobs, old_logps = sampler_logps = inference_logprobs (prime-rl's ratio is
  trainer / inference: there is no recomputed behaviour policy), so the ledger's one point is
  'trainer';
  groups: the export has no group id, so completions with the same prompt tokens form a group;
  rewards: not exported (NaN); truncation: not exported (False).
The framework's own per-token coefficient (``framework_coef``) is d loss / d trainer_logprobs of
the rl component of prime-rl's default loss (``default_loss_fn``, DPPO + KL, ``compute_loss``):
  (-(1 - is_masked) adv_tau A r + 2 kl_tau log r) w_rl / N_rl on loss tokens, r = exp(trainer -
  inference), w_rl the rl weight stream (1 when absent), N_rl the step's loss tokens with w_rl != 0
  over every rank; adv_tau and kl_tau are not exported (prime-rl's defaults 1.0 and 1e-3 unless
  given). Under a loss without the DPPO mask (``is_masked`` null) it is not computed. The weight
  streams themselves are kept as ``framework_rl_weights`` etc. when present.
"""

import glob
import math
import os

import numpy as np

from jtc import files
from jtc.interop import rollouts as rl

PER_TOKEN = ('token_ids', 'loss_mask', 'advantages', 'inference_logprobs', 'trainer_logprobs')
STREAMS = ('rl_weights', 'ce_weights', 'ref_kl_weights', 'is_masked')
DEFAULT_HPARAMS = {'adv_tau': 1.0, 'kl_tau': 1e-3}


def rank_files(path):
  """The rank files of a step directory (rank order), or [path] for one file."""
  if os.path.isdir(path):
    found = glob.glob(os.path.join(path, 'rank_*.jsonl'))
    if not found:
      raise rl.DumpError(
          path, None, 'no rank_<rank>.jsonl in this directory (prime-rl writes '
          '<run_dir>/token_exports/step_<step>/rank_<rank>.jsonl)')
    return sorted(found, key=lambda p: int(os.path.basename(p)[5:-6] or 0))
  if not os.path.exists(path):
    raise FileNotFoundError(f'no such file or directory {path!r}')
  return [path]


def _record(record, where):
  tokens = rl.ids(rl.require(record, 'token_ids', where), 'token_ids', where)
  n = len(tokens)
  loss_mask = rl.require(record, 'loss_mask', where)
  if not isinstance(loss_mask, list) or len(loss_mask) != n:
    raise rl.DumpError(
        where, 'loss_mask', f'ragged: {len(loss_mask)} values for {n} tokens' if isinstance(
            loss_mask, list) else 'expected a list of booleans')
  loss_mask = [bool(v) for v in loss_mask]
  cols = {k: rl.floats(rl.require(record, k, where), k, where, n) for k in PER_TOKEN[2:]}
  streams = {}
  for k in STREAMS:
    values = record.get(k)
    if values is not None and any(v is not None for v in values):
      streams[k] = rl.floats(values, k, where, n)
  return tokens, loss_mask, cols, streams


def _advantage(adv, loss_mask, where):
  on_loss = {a for a, m in zip(adv, loss_mask) if m}
  if len(on_loss) != 1 or any(math.isnan(a) for a in on_loss):
    raise rl.DumpError(
        where, 'advantages', f'the loss tokens carry {len(on_loss)} different advantages '
        f'({sorted(on_loss)[:4]}); jtc\'s objectives take one advantage per completion')
  return on_loss.pop()


def framework_coef(records, *, adv_tau, kl_tau):
  """[per record] prime-rl's per-token coefficient of the rl component (module docstring), or
  None when a record has no DPPO mask (a loss other than the default)."""
  n_rl = 0
  for _, loss_mask, _, streams in records:
    w = streams.get('rl_weights')
    n_rl += sum(1 for t, m in enumerate(loss_mask) if m and (w is None or w[t] != 0))
  n_rl = max(n_rl, 1)
  out = []
  for _, loss_mask, cols, streams in records:
    if 'is_masked' not in streams:
      return None
    m = np.asarray(loss_mask, np.float64)
    w = np.asarray(streams.get('rl_weights', np.ones(len(m))), np.float64)
    rl_m = m * (w != 0)
    log_r = np.asarray(cols['trainer_logprobs'], np.float64) - np.asarray(
        cols['inference_logprobs'], np.float64)
    keep = rl_m * (1.0 - np.nan_to_num(np.asarray(streams['is_masked'], np.float64)))
    adv = np.asarray(cols['advantages'], np.float64)
    coef = (-keep * adv_tau * adv * np.exp(log_r) + 2.0 * kl_tau * rl_m * log_r) * w / n_rl
    out.append(np.where(rl_m > 0, coef, 0.0))
  return out


def read(path, *, framework_hparams=None):
  """The `Rollout` records of a prime-rl token-export step (module docstring)."""
  hp = dict(DEFAULT_HPARAMS)
  for k, v in (framework_hparams or {}).items():
    if k not in hp:
      raise ValueError(f'unknown prime-rl hyper-parameter {k!r}; valid: {sorted(hp)}')
    hp[k] = float(v)
  records, meta = [], []
  for path_k in rank_files(path):
    expected = 'prime-rl token-export records (one JSON object a line)'
    for i, record in enumerate(files.read_jsonl(path_k, expected=expected), start=1):
      where = f'{path_k}:{i}'
      records.append(_record(record, where))
      meta.append((where, record.get('step')))
  if not records:
    raise rl.DumpError(path, None, 'no record (an exported sequence has at least one loss token)')
  coefs = framework_coef(records, **hp)
  out = []
  for k, ((tokens, loss_mask, cols, streams), (where, step)) in enumerate(zip(records, meta)):
    if not any(loss_mask):
      raise rl.DumpError(where, 'loss_mask', 'no loss token (prime-rl exports none such)')
    start = loss_mask.index(True)
    if start == 0:
      raise rl.DumpError(where, 'loss_mask', 'the first token carries loss: no prompt before it')
    tail = lambda xs, s=start: list(xs[s:])
    framework = {k2: tail(v) for k2, v in streams.items() if k2 != 'is_masked'}
    if 'is_masked' in streams:
      framework['is_masked'] = tail(streams['is_masked'])
    if coefs is not None:
      framework['coef'] = tail(coefs[k])
    inference = tail(cols['inference_logprobs'])
    w = streams.get('rl_weights')
    mask = [float(m and (w is None or w[start + t] != 0)) for t, m in enumerate(tail(loss_mask))]
    out.append(
        rl.Rollout(where=where, step=int(step) if isinstance(step, int) else -1,
                   group=tuple(tokens[:start]), prompt_ids=tokens[:start],
                   completion_ids=tokens[start:], mask=mask,
                   advantage=_advantage(cols['advantages'], loss_mask,
                                        where), logps=tail(cols['trainer_logprobs']),
                   old_logps=inference, sampler_logps=inference, framework=framework))
  return out, {
      'format':
          'prime-rl',
      'point':
          'trainer',
      'framework_hparams':
          hp,
      'framework_coef':
          None if coefs is None else ('prime-rl default loss (DPPO + KL), rl component: '
                                      '(-(1 - is_masked) adv_tau A r + 2 kl_tau log r) w_rl / N_rl')
  }
