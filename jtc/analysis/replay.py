"""Replay: several objectives applied to the same frozen rollout batch at the same parameters.

  python -m jtc.ledger replay W --step N --objectives grpo,gspo,dfpo_min_replace [--contexts 4]

From a ledger step (`jtc.analysis.ledger`: the rollouts and the parameters before each update), at
each point (the behaviour policy; before the step's second update, where the update is off-policy)
and for each objective:
  * the per-token coefficients c_{b,t} = d loss / d log pi_{b,t} and flags (`token_ledger`);
  * the cancellation residual per group: net / gross coefficient mass on the tokens the whole group
    shares, sum_t |sum_i c_{i,t}| / sum_t sum_i |c_{i,t}| (0: they cancel, Eq. 2; 1: none does);
  * the parameter update's direction g = sum c grad log pi (one backward pass, exact) and the
    cosine between the objectives' g;
  * the KL drift that a step of the run's learning rate along -g causes at shared contexts
    (Prop. 3.1: measured KL and 1/2 eta^2 g^T F g), at the first ``contexts`` shared positions.
Replaying the run's own objective on the run's own mini-batches reproduces its logged loss and
grad_norm for that step (`reproduce`). Objectives use their default hyper-parameters, the run's
own objective the run's.

Dimension key (docs/dimensions.md): B rows, G group size, T completion length, P prompt width, L = P + T, M groups.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jtc import objectives
from jtc.analysis import diagnostics
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import metric_writer
from jtc.analysis import probes
from jtc.models import logprobs


def check_objectives(ledger, names):
  """ValueError before any compute for an unknown objective (naming the valid ones) or one the
  run's ledger cannot feed (a token-weighted loss without token weights)."""
  unknown = [n for n in names if n not in objectives.LOSSES]
  if unknown or not names:
    raise ValueError(f'unknown objective(s) {unknown or names}; valid: {sorted(objectives.LOSSES)}')
  for n in names:
    if objectives.LOSSES[n].token_weighted and 'token_weights_BT' not in ledger.columns:
      raise ValueError(f'objective {n!r} needs per-token weights (DelTA lambda) and the run '
                       f'({ledger.meta["loss"]}) logged none; replay it on a run of {n}')


def open_for_replay(workdir, step, names):
  """The ledger of ``workdir``'s step ``step``, checked for the objectives ``names`` before any
  compute. FileNotFoundError / ValueError naming what is wrong: a missing workdir, a
  population's workdir (its members hold the ledgers), a step without a ledger, an unknown
  objective or one the run cannot feed."""
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'no such workdir {workdir!r}')
  members = metric_writer.run_dirs(workdir)
  if members != [workdir] and not ledger_lib.steps(workdir):
    raise ValueError(f'{workdir} is a population: pass one member\'s directory, e.g. '
                     f'{members[0]} ({len(members)} members)')
  ledger = ledger_lib.load(workdir, step)
  check_objectives(ledger, names)
  return ledger


def hparams_for(ledger, name):
  """The run's hyper-parameters for its own objective, the defaults for the others (the common
  KL / entropy keys of the run either way)."""
  run_hp = ledger.meta['loss_hparams']
  if name == ledger.meta['loss']:
    return dict(run_hp)
  hp = dict(objectives.default_hparams(name))
  hp.update({k: run_hp[k] for k in ('kl_coef', 'kl_estimator') if k in run_hp})
  return {k: v for k, v in hp.items() if v is not None}


def _batch(ledger):
  c = ledger.columns
  tokens_BL = np.concatenate([c['prompt_BP'], c['completion_BT']], axis=1)
  input_mask_BL = np.concatenate([c['prompt_mask_BP'], c['completion_mask_BT']], axis=1)
  optional = lambda k: jnp.asarray(c[k]) if k in c else None
  return (jnp.asarray(tokens_BL), jnp.asarray(input_mask_BL), jnp.asarray(c['old_logps_BT']),
          jnp.asarray(c['advantages_B']), jnp.asarray(c['mask_BT']), optional('token_weights_BT'),
          optional('ref_logps_BT'), optional('is_weights_BT'))


def group_residual(coef_BT, shared_BT, *, group_size):
  """[M] net / gross coefficient mass on each group's shared tokens (NaN: none shared)."""
  T = coef_BT.shape[1]
  c_MGT = jnp.where(shared_BT, coef_BT, 0.0).reshape(-1, group_size, T)
  net_M = jnp.sum(jnp.abs(jnp.sum(c_MGT, axis=1)), axis=-1)
  gross_M = jnp.sum(jnp.abs(c_MGT), axis=(1, 2))
  return jnp.where(gross_M > 0, net_M / jnp.where(gross_M > 0, gross_M, 1.0), jnp.nan)


def _flat(tree):
  return jnp.concatenate([x.ravel().astype(jnp.float32) for x in jax.tree_util.tree_leaves(tree)])


def shared_contexts(ledger, n):
  """The first ``n`` (row, position) pairs whose context the whole group shares (one per group)."""
  shared, G = ledger['shared_BT'], ledger.meta['group_size']
  out = []
  for g in range(shared.shape[0] // G):
    ts = np.flatnonzero(shared[g * G])
    if len(ts):
      out.append((g * G, int(ts[len(ts) // 2])))
    if len(out) == n:
      break
  return out


def stored_logps(ledger, point):
  """(logps_BT, old_logps_BT) of an imported ledger's ``point`` as stored, 0 standing in for both
  where log pi is unavailable (a dump without log-probs, at the behaviour point: ratio 1, and the
  coefficients depend on the difference only)."""
  c = ledger.columns
  logps_BT, old_BT = c[f'logps_{point}_BT'], c['old_logps_BT']
  unknown_BT = np.isnan(logps_BT) | np.isnan(old_BT)
  return (jnp.asarray(np.where(unknown_BT, 0.0,
                               logps_BT)), jnp.asarray(np.where(unknown_BT, 0.0, old_BT)))


def _result(cols, mask_BT, G, grad_norm, drift, where):
  residual_M = group_residual(cols['coef'], cols['shared'] & (mask_BT > 0), group_size=G)
  return {
      'coef':
          np.asarray(cols['coef']).tolist(),
      'clip_low':
          np.asarray(cols['clip_low']).tolist(),
      'clip_high':
          np.asarray(cols['clip_high']).tolist(),
      'gated':
          np.asarray(cols['gated']).tolist(),
      'ratio':
          np.asarray(cols['ratio']).tolist(),
      'residual_by_group': [None if np.isnan(r) else float(r) for r in np.asarray(residual_M)],
      'residual':
          float(np.nanmean(np.asarray(residual_M))) if np.any(np.isfinite(residual_M)) else None,
      'grad_norm':
          grad_norm,
      'kl_drift': [{
          'row': b,
          'position': t,
          'kl': float(d['kl']),
          'predicted': float(d['predicted'])
      } for (b, t), d in zip(where, drift)]
  }


def replay(ledger, names, *, contexts=4):
  """{point: {'objectives': {name: {...}}, 'cosine': [[...]]}} (module docstring); every array
  as nested lists, so the result is JSON for the viewer. An imported ledger
  (`jtc.interop.ledger_import`) is replayed on its stored log-probs; without a stored policy its
  gradient norms, KL drift and cosines are None / [] (they need the model)."""
  check_objectives(ledger, names)
  imported, policy = 'source' in ledger.meta, ledger.has_policy
  config = ledger.params(0)[0] if policy else None
  tokens_BL, input_mask_BL, old_BT, adv_B, mask_BT, weights_BT, ref_BT, is_BT = _batch(ledger)
  G, P, lr = ledger.meta['group_size'], ledger.meta['completion_start'], ledger.meta[
      'learning_rate']
  where = shared_contexts(ledger, contexts) if policy and lr else []
  out = {}
  for k, point in enumerate(ledger.points):
    params = ledger.params(k)[1] if policy else None
    if imported:
      logps_BT, old_BT = stored_logps(ledger, point)
    else:
      logps_BT = logprobs.sequence_logprobs(params, config, tokens_BL, input_mask_BL,
                                            completion_start=P)['logps']
    per, grads = {}, {}
    for name in names:
      cols = ledger_lib.token_ledger(logps_BT, tokens_BL=tokens_BL, input_mask_BL=input_mask_BL,
                                     old_logps_BT=old_BT, advantages_B=adv_B, mask_BT=mask_BT,
                                     group_size=G, completion_start=P, loss_name=name,
                                     loss_hparams=hparams_for(ledger,
                                                              name), token_weights_BT=weights_BT,
                                     ref_logps_BT=ref_BT, is_weights_BT=is_BT)
      drift = []
      if policy:
        grads[name] = diagnostics.net_gradient(params, config, tokens_BL, input_mask_BL,
                                               cols['coef'], completion_start=P)
        drift = [
            probes.kl_drift_at_context(params, config, tokens_BL[b], input_mask_BL[b],
                                       position=P + t, step_size=lr,
                                       direction=jax.tree.map(jnp.negative, grads[name]))
            for b, t in where
        ]
      per[name] = _result(cols, mask_BT, G,
                          float(optax.tree.norm(grads[name])) if policy else None, drift, where)
    out[point] = {'objectives': per, 'cosine': _cosines(grads, names) if policy else None}
  return out


def _cosines(grads, names):
  flat = {n: _flat(g) for n, g in grads.items()}
  return [[
      float(
          jnp.dot(flat[a], flat[b]) /
          jnp.maximum(jnp.linalg.norm(flat[a]) * jnp.linalg.norm(flat[b]), 1e-30)) for b in names
  ] for a in names]


def reproduce(ledger):
  """The run's own loss and grad_norm of the step, recomputed: the mean over the first epoch's
  updates k of the loss (and its gradient's norm) on update k's rows at the parameters before
  it. Equals the logged values when the step has one epoch."""
  config, _ = ledger.params(0)
  tokens_BL, input_mask_BL, old_BT, adv_B, mask_BT, weights_BT, ref_BT, is_BT = _batch(ledger)
  name, hp = ledger.meta['loss'], dict(ledger.meta['loss_hparams'])
  G, P = ledger.meta['group_size'], ledger.meta['completion_start']
  losses, norms = [], []
  for k, rows in enumerate(ledger.meta['updates']):
    _, params = ledger.params(k)
    rows = jnp.asarray(rows)

    def loss_fn(p, rows=rows):
      out = logprobs.sequence_logprobs(p, config, tokens_BL[rows], input_mask_BL[rows],
                                       completion_start=P)
      return objectives.compute_loss(name, logps=out['logps'], old_logps=old_BT[rows],
                                     advantages=adv_B[rows], mask=mask_BT[rows], group_size=G,
                                     entropy=out['entropy'],
                                     token_weights=None if weights_BT is None else weights_BT[rows],
                                     ref_logps=None if ref_BT is None else ref_BT[rows],
                                     is_weights=None if is_BT is None else is_BT[rows], **hp)[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    losses.append(float(loss))
    norms.append(float(optax.tree.norm(grads)))
  return {'loss': float(np.mean(losses)), 'grad_norm': float(np.mean(norms))}


def summary_lines(ledger, names, replayed):
  """The replay as text: per point and objective the shared-token residual, the update's
  gradient norm and the KL drift at shared contexts, the cosines between the updates, and the
  run's own loss and grad_norm recomputed (`reproduce`) beside the logged ones."""
  lines = []
  for point, result in replayed.items():
    lines.append(f'[{point}] objective | shared-token residual | update grad norm | KL drift at '
                 'shared contexts (measured / 1/2 eta^2 gFg)')
    for n in names:
      r = result['objectives'][n]
      drift = ', '.join(f'{d["kl"]:.2e}/{d["predicted"]:.2e}' for d in r['kl_drift'])
      res = 'n/a' if r['residual'] is None else f'{r["residual"]:.4f}'
      norm = 'n/a' if r['grad_norm'] is None else f'{r["grad_norm"]:.4e}'
      lines.append(f'  {n:22s} | {res:>8s} | {norm:>10s} | {drift or "n/a"}')
    if result['cosine'] is None:
      lines.append('  cosine between the updates: n/a (an imported ledger without a policy: '
                   'import with --policy.checkpoint)')
    else:
      lines.append('  cosine between the updates: ' +
                   '; '.join(f'{a}~{b} {result["cosine"][i][j]:+.3f}' for i, a in enumerate(names)
                             for j, b in enumerate(names) if j > i))
  if 'source' in ledger.meta:  # an import: no run of jtc's logged a loss to reproduce
    return lines
  metrics = os.path.join(os.path.dirname(os.path.dirname(ledger.path)), 'metrics.jsonl')
  logged = next(
      (r for r in metric_writer.read_jsonl(metrics) if r.get('step') == ledger.meta['step']), {})
  again = reproduce(ledger)
  lines.append(f'run objective {ledger.meta["loss"]}: loss {again["loss"]:.6g} (logged '
               f'{logged.get("loss", "n/a")}), grad_norm {again["grad_norm"]:.6g} (logged '
               f'{logged.get("grad_norm", "n/a")})')
  return lines


def write_replay(ledger, names, replayed):
  """Writes ``<ledger dir>/replay.json`` (the objectives and every point's replay); returns its
  path."""
  path = os.path.join(ledger.path, 'replay.json')
  with open(path, 'w') as f:
    json.dump({'objectives': names, 'points': replayed}, f)
  return path
