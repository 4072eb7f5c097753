"""`jtc conform`: anyone's RL loss against jtc's per-token coefficients, and the invariances a
correct loss has.

  jtc conform --loss MODULE:FUNCTION --objective NAME --aggregation AGG
              [--framework torch|jax|numpy] [--hparams k=v,...] [--accumulation mean|sum]

The function (`jtc.interop.conform_grad` says how it is called) is put through the batches of
`jtc.interop.conform_batches` and these checks; a token differs when
|g - c| > tol (|c| + 0.1 s), g the function's d loss / d logp (float64), c the reference, s the
larger of max|c| and max|A| / N (N real tokens: `scale_of`):
  gradient      g equals jtc's closed form c = d loss / d log pi for --objective, --aggregation
                and the hyper-parameters (`jtc.analysis.diagnostics.loss_coefficients`, computed
                on the log-ratios), token by token, on every batch;
  weights       the effective importance weight g / c of every token jtc weighs is neither 0 nor
                non-finite nor far below 1 (< 0.1): a dropped or exploded ratio, a gradient
                stopped through it, a sequence weight that shrinks with length;
  micro-batch   the batch cut into micro-batches of equal rows (each padded to its own longest
                row, as frameworks pad) and accumulated as declared (--accumulation mean: the
                micro-batch losses averaged, the Hugging Face default; sum: added, the function
                given the global counts) has the full batch's gradient;
  data-parallel the rows split over ranks, each rank's gradient averaged (DDP / FSDP), has the
                full batch's gradient;
  padding       extra padding columns (holding garbage log-probs) change no real token's
                gradient and get none;
  permutation   permuting groups and rows within groups permutes the gradient alike.
Objectives that couple a group's members (DFPO) are split at group boundaries only. The report
says per check what differs, on which tokens and by how much; the first failing batch is saved
(npz). The run passes (exit 0) only when every check passes.

Dimension key (docs/dimensions.md): B rows, G group size, T completion length.
"""

import dataclasses
import os
import tempfile

import numpy as np

from jtc import objectives
from jtc.interop import conform_batches
from jtc.interop import conform_grad

ACCUMULATIONS = ('mean', 'sum')
TOLERANCE = 1e-4
CHECKS = ('gradient', 'weights', 'micro-batch', 'data-parallel', 'padding', 'permutation')
# Whose coefficient is not the derivative of its value (a stop-gradient): no finite differences.
STOP_GRADIENT = ('cispo', 'gspo_token')


@dataclasses.dataclass
class Finding:
  """One check on one batch: passed, and the line that says what differs."""
  check: str
  batch: str
  passed: bool
  detail: str
  data: dict | None = None


def coupled(objective):
  """Whether the objective couples a group's members (its split checks keep groups whole)."""
  return objective.startswith('dfpo_')


def check_request(objective, aggregation, hparams, framework, accumulation):
  """ValueError naming a bad value before any compute."""
  if objective not in objectives.LOSSES:
    raise ValueError(f'--objective {objective!r} is not valid; valid: {sorted(objectives.LOSSES)}')
  if aggregation not in objectives.AGGREGATIONS:
    raise ValueError(f'--aggregation {aggregation!r} is not valid; valid: '
                     f'{sorted(objectives.AGGREGATIONS)}')
  if accumulation not in ACCUMULATIONS:
    raise ValueError(f'--accumulation {accumulation!r} is not valid; valid: '
                     f'{", ".join(ACCUMULATIONS)}')
  if framework not in conform_grad.FRAMEWORKS:
    raise ValueError(f'--framework {framework!r} is not valid; valid: '
                     f'{", ".join(conform_grad.FRAMEWORKS)}')
  ref = reference_hparams(objective, aggregation, hparams)
  if framework == 'numpy' and (objective in STOP_GRADIENT or
                               (coupled(objective) and ref.get('stop_gradient', True))):
    raise ValueError(f'--objective {objective}: its coefficient is not the derivative of its value '
                     '(a stop-gradient), which finite differences cannot see; pass a torch or jax '
                     'function (--framework torch|jax)')


def reference_hparams(objective, aggregation, hparams):
  """The hyper-parameters jtc's closed form takes: those of ``hparams`` that ``objective`` has
  (the function may take others, e.g. an adapter's own names), checked."""
  valid = objectives.default_hparams(objective)
  ref = {k: v for k, v in hparams.items() if k in valid and k != 'aggregation'}
  ref['aggregation'] = aggregation
  return objectives.check_hparams(objective, ref) and ref


_CLOSED_FORMS = {}


def closed_form(objective, hp, batch):
  """jtc's c_BT for ``batch`` (float64 out; computed on the log-ratios, so no log-prob rounding
  enters the ratios), one compiled program per objective, hyper-parameters and shape."""
  import jax  # pylint: disable=import-outside-toplevel
  from jtc.analysis import diagnostics  # pylint: disable=import-outside-toplevel
  key = (objective, tuple(sorted(hp.items())))
  if key not in _CLOSED_FORMS:

    def coefficients(log_r, adv, mask, tw, group_size):
      return diagnostics.loss_coefficients(log_r, loss_name=objective, old_logps=0.0 * log_r,
                                           advantages=adv, mask=mask, group_size=group_size,
                                           token_weights=tw, **hp)[0]

    _CLOSED_FORMS[key] = jax.jit(coefficients, static_argnames='group_size')
  log_r = np.where(batch.mask_BT > 0, batch.logp_BT - batch.old_logp_BT, 0.0).astype(np.float32)
  tw = None if batch.token_weights_BT is None else batch.token_weights_BT.astype(np.float32)
  coef = _CLOSED_FORMS[key](log_r, batch.adv_B.astype(np.float32), batch.mask_BT.astype(np.float32),
                            tw, group_size=batch.group_size)
  return np.asarray(coef, np.float64)


def scale_of(batch, c):
  """s = max(max|c|, max|A| / N), N the batch's real tokens: the largest coefficient, floored at a
  natural size of one (a batch whose coefficients are all zero up to float32 rounding, e.g. DFPO's
  orthogonal projection on rows of equal length, is then not judged by its rounding noise)."""
  floor = np.max(np.abs(batch.adv_B)) / max(float((batch.mask_BT > 0).sum()), 1.0)
  return max(float(np.max(np.abs(c))), floor)


def differ(g, c, tol, scale):
  """[B, T] bool: the tokens where g and c differ: |g - c| > tol (|c| + 0.1 s), s = `scale_of`."""
  return ~np.isfinite(g) | (np.abs(g - c) > tol * (np.abs(c) + 0.1 * scale))


def describe(g, c, bad, batch):
  """What differs: how many tokens, the worst one and the typical factor g / c."""
  n_real = int((batch.mask_BT > 0).sum())
  err = np.where(bad, np.abs(np.nan_to_num(g - c, nan=np.inf)), -1.0)
  b, t = np.unravel_index(np.argmax(err), err.shape)
  ratio = np.exp(batch.logp_BT[b, t] - batch.old_logp_BT[b, t])
  where = 'padding' if batch.mask_BT[b, t] == 0 else f'ratio {ratio:.4g}, A {batch.adv_B[b]:+.3g}'
  both = bad & (c != 0) & np.isfinite(g)
  factor = (f'; function / jtc: median {np.median(g[both] / c[both]):.4g} over those'
            if both.any() else '')
  return (f'{int(bad.sum())} of {n_real} tokens differ; worst row {b} position {t} ({where}): '
          f'function {g[b, t]:.6g}, jtc {c[b, t]:.6g}{factor}')


def check_gradient(batch, g, c, tol):
  scale = scale_of(batch, c)
  bad = differ(g, c, tol, scale)
  detail = describe(
      g, c, bad, batch) if bad.any() else (f'max |g - c| / s = {np.max(np.abs(g - c)) / scale:.2g}')
  return Finding('gradient', batch.name, not bad.any(), detail)


def check_weights(batch, g, c):
  """Effective importance weights g / c on the tokens jtc weighs (|c| > 1e-3 s, `scale_of`)."""
  weighed = np.abs(c) > 1e-3 * scale_of(batch, c)
  w = np.where(weighed, np.divide(g, np.where(weighed, c, 1.0)), 1.0)
  flags = {
      'non-finite': weighed & ~np.isfinite(w),
      '0': weighed & (w == 0),
      'far below 1 (< 0.1)': weighed & np.isfinite(w) & (w != 0) & (w < 0.1)
  }
  found = [f'{int(m.sum())} tokens {k}' for k, m in flags.items() if m.any()]
  if not found:
    span = f'{w[weighed].min():.4g}..{w[weighed].max():.4g}' if weighed.any() else 'n/a'
    return Finding('weights', batch.name, True, f'g / c in {span}')
  finite = w[weighed & np.isfinite(w)]
  return Finding(
      'weights', batch.name, False,
      f'importance weight g / c: {"; ".join(found)} of {int(weighed.sum())} '
      f'(median {np.median(finite) if finite.size else float("nan"):.4g})')


def splits(B, G, objective):
  """{'n micro-batches': [row index arrays]}: contiguous equal row blocks, cutting groups unless
  the objective couples them."""
  out = {}
  for n in (2, 4, B):
    rows = B // n
    if B % n or n < 2 or (coupled(objective) and rows % G):
      continue
    out[n] = [np.arange(k * rows, (k + 1) * rows) for k in range(n)]
  return out


def _scatter(batch, parts, grads):
  full = np.zeros(batch.shape)
  for idx, g in zip(parts, grads):
    full[idx, :g.shape[1]] = g
  return full


def check_split(kind, call, batch, g_full, objective, accumulation, tol):
  """micro-batch or data-parallel: every split of `splits` against the full batch's gradient."""
  B, T = batch.shape
  context = dict(num_tokens=float((batch.mask_BT > 0).sum()), num_sequences=B, norm_length=T)
  for n, parts in splits(B, batch.group_size, objective).items():
    if kind == 'data-parallel':
      grads = [call(batch.rows(p), dp_size=n, **context)[1] / n for p in parts]
    else:
      scale = 1.0 / n if accumulation == 'mean' else 1.0
      grads = [call(batch.rows(p), **context)[1] * scale for p in parts]
    g = _scatter(batch, parts, grads)
    bad = differ(g, g_full, tol, scale_of(batch, g_full))
    if bad.any():
      what = f'{n} {"ranks" if kind == "data-parallel" else "micro-batches"} of {B // n} rows'
      return Finding(kind, batch.name, False, f'{what}: ' + describe(g, g_full, bad, batch))
  return Finding(kind, batch.name, True,
                 f'splits into {sorted(splits(B, batch.group_size, objective))}')


def check_padding(call, batch, g_full, tol, pad=5, seed=0):
  rng = np.random.default_rng(seed)
  B, T = batch.shape
  widen = lambda x, fill: np.concatenate([x, fill], axis=1)
  tw = batch.token_weights_BT
  padded = conform_batches.Batch(batch.name, widen(batch.logp_BT, rng.uniform(-9, 0, (B, pad))),
                                 widen(batch.old_logp_BT, rng.uniform(-9, 0,
                                                                      (B, pad))), batch.adv_B,
                                 widen(batch.mask_BT, np.zeros((B, pad))), batch.group_size,
                                 None if tw is None else widen(tw, rng.uniform(0, 2, (B, pad))))
  _, g = call(padded, num_tokens=float((batch.mask_BT > 0).sum()), num_sequences=B, norm_length=T)
  bad = differ(g, widen(g_full, np.zeros((B, pad))), tol, scale_of(batch, g_full))
  detail = (f'{pad} padding columns: ' + describe(g, widen(g_full, np.zeros(
      (B, pad))), bad, padded) if bad.any() else f'{pad} padding columns')
  return Finding('padding', batch.name, not bad.any(), detail)


def check_permutation(call, batch, g_full, tol, seed=0):
  rng = np.random.default_rng(seed)
  B, T = batch.shape
  G = batch.group_size
  groups = rng.permutation(B // G)
  perm = np.concatenate([g * G + rng.permutation(G) for g in groups])
  _, g = call(batch.rows(perm, T=T), num_tokens=float((batch.mask_BT > 0).sum()), num_sequences=B,
              norm_length=T)
  bad = differ(g, g_full[perm], tol, scale_of(batch, g_full))
  detail = 'groups and rows within groups permuted' + (
      ': ' + describe(g, g_full[perm], bad, batch.rows(perm, T=T)) if bad.any() else '')
  return Finding('permutation', batch.name, not bad.any(), detail)


@dataclasses.dataclass
class Result:
  """A run's findings, the first failing batch and where it was saved."""
  findings: list
  saved: str | None = None

  @property
  def passed(self):
    return all(f.passed for f in self.findings)


def _save(path, batch, finding, g, c):
  if path is None:
    fd, path = tempfile.mkstemp(prefix='jtc_conform_', suffix='.npz')
    os.close(fd)
  tw = {} if batch.token_weights_BT is None else {'token_weights_BT': batch.token_weights_BT}
  np.savez(path, logp_BT=batch.logp_BT, old_logp_BT=batch.old_logp_BT, adv_B=batch.adv_B,
           mask_BT=batch.mask_BT, group_size=batch.group_size, function_grad_BT=g, jtc_coef_BT=c,
           check=finding.check, batch=batch.name, detail=finding.detail, **tw)
  return path


def run(fn, *, name, objective, aggregation, hparams=None, framework='torch', accumulation='mean',
        tol=TOLERANCE, seed=0, save=None):
  """Every check of the module docstring on ``fn``; a `Result`. ValueError / LossError (one line)
  for bad input, before any check."""
  hparams = dict(hparams or {})
  check_request(objective, aggregation, hparams, framework, accumulation)
  hp = reference_hparams(objective, aggregation, hparams)
  call = conform_grad.Caller(fn, framework, hparams, name=name, aggregation=aggregation)
  batches = conform_batches.make(objective, {
      k: v for k, v in hp.items() if k != 'aggregation'
  }, seed=seed)
  findings, saved = [], None
  for batch in batches:
    B, T = batch.shape
    ctx = dict(num_tokens=float((batch.mask_BT > 0).sum()), num_sequences=B, norm_length=T)
    _, g = call(batch, **ctx)
    c = closed_form(objective, hp, batch)
    new = [check_gradient(batch, g, c, tol), check_weights(batch, g, c)]
    if batch.name in ('random', 'short and long'):
      new += [
          check_split('micro-batch', call, batch, g, objective, accumulation, tol),
          check_split('data-parallel', call, batch, g, objective, accumulation, tol),
          check_padding(call, batch, g, tol),
          check_permutation(call, batch, g, tol)
      ]
    failed = next((f for f in new if not f.passed), None)
    if failed is not None and saved is None:
      saved = _save(save, batch, failed, g, c)
    findings += new
  return Result(findings, saved)


def report(result, *, name, objective, aggregation, hparams, framework, accumulation,
           tol=TOLERANCE):
  """The lines `jtc conform` prints: one per check (PASS, or FAIL with what differs)."""
  hp = ', '.join(f'{k}={v}' for k, v in sorted(hparams.items())) or 'defaults'
  lines = [
      f'{name} against jtc\'s {objective} ({aggregation}; {hp}); {framework}, float64; '
      f'micro-batches accumulated: {accumulation}; tolerance |g - c| <= {tol:g} (|c| + 0.1 s)'
  ]
  for check in CHECKS:
    mine = [f for f in result.findings if f.check == check]
    bad = [f for f in mine if not f.passed]
    if bad:
      lines.append(f'  FAIL {check:13s} on {len(bad)} of {len(mine)} batches; batch '
                   f'{bad[0].batch!r}: {bad[0].detail}')
    else:
      lines.append(f'  PASS {check:13s} {len(mine)} batches ({", ".join(f.batch for f in mine)})')
  failed = [c for c in CHECKS if any(not f.passed for f in result.findings if f.check == c)]
  if result.saved:
    lines.append(f'first failing batch saved: {result.saved}')
  lines.append('result: ' + ('PASS: every check' if not failed else
                             f'FAIL: {", ".join(failed)} ({len(failed)} of {len(CHECKS)} checks)'))
  return lines
