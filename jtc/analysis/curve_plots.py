r"""Training curves of one or more runs on one figure (the command is `jtc plot`, `jtc.cli.plot`).

Each run is a workdir of `jtc train` (its `metrics.jsonl`, one JSON object per line with 'step',
is read); a population's workdir stands for its members (`metric_writer.run_dirs`). Every panel
has a human title and y-label (`describe(key)`: a table of known keys, patterns such as
'eval/avg@K', and a readable fallback for the rest).

  * Runs are named by the shortest path suffix that tells them apart (`run_labels`), so
    `a/seed0` and `b/seed0` are two curves named 'a/seed0' and 'b/seed0', not two 'seed0'.
  * ``smooth=N`` draws the trailing mean of the last N logged points over the raw curve, which
    stays faint behind it. Sparse curves (logged every few steps, like held-out evaluations)
    are never smoothed and get markers on their points.
  * The legend sits outside every axes that holds data, so it never covers a curve: in the
    first unused panel slot when the grid has one, else below the panels.
  * Without ``keys``: held-out accuracy first, then the DEFAULT_KEYS present in some run.
    A key that no run logs is an error listing the keys the files do have.

For DelTA runs the token clouds (tokens with the highest / lowest mean lambda) go to
`<out>_tokens.png`.
"""

import os
import re

import matplotlib

matplotlib.use('Agg')
import matplotlib.lines as mlines  # pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from jtc import files
from jtc.analysis import curves
from jtc.analysis import metric_writer

DEFAULT_KEYS = ('reward_mean', 'accuracy', 'entropy', 'response_length', 'asym', 'clip_frac_high',
                'approx_kl', 'format/entropy')

# key -> (panel title, y-axis label).
KNOWN_KEYS = {
    'reward_mean': ('Mean reward', 'reward'),
    'reward_std': ('Reward standard deviation', 'reward'),
    'accuracy': ('Training accuracy', 'fraction correct'),
    'entropy': ('Policy entropy', 'nats per token'),
    'response_length': ('Response length', 'tokens'),
    'frac_truncated': ('Truncated responses', 'fraction'),
    'asym': ('Sign asymmetry of the update (Asym, Eq. 23)', 'Asym'),
    'clip_frac_high': ('Tokens clipped above (ratio > 1 + eps)', 'fraction of tokens'),
    'clip_frac_low': ('Tokens clipped below (ratio < 1 - eps)', 'fraction of tokens'),
    'approx_kl': ('Approximate KL to the behaviour policy', 'nats'),
    'ratio_mean': ('Mean importance ratio', 'ratio'),
    'ratio_min': ('Smallest importance ratio', 'ratio'),
    'ratio_max': ('Largest importance ratio', 'ratio'),
    'seq_ratio_mean': ('Mean sequence importance ratio', 'ratio'),
    'loss': ('Loss', 'loss'),
    'pg_loss': ('Policy-gradient loss', 'loss'),
    'grad_norm': ('Gradient norm', 'L2 norm'),
    'param_norm': ('Parameter norm', 'L2 norm'),
    'update_norm': ('Update norm', 'L2 norm'),
    'learning_rate': ('Learning rate', 'learning rate'),
    'frac_degenerate_groups': ('Groups with equal rewards', 'fraction of groups'),
    'dynamic_sampling_rounds': ('Dynamic-sampling refill rounds', 'rounds'),
    'tokens_per_s': ('Throughput', 'generated tokens / s'),
    'time_sample': ('Sampling time per step', 'seconds'),
    'time_score': ('Scoring time per step', 'seconds'),
    'time_update': ('Update time per step', 'seconds'),
    'format/entropy': ('Format entropy of correct samples', 'nats'),
    'eval/format/entropy': ('Held-out format entropy of correct samples', 'nats'),
    'diag/asym': ('Asym on the rollout batch (Eq. 23)', 'Asym'),
    'diag/coef_abs_mean': ('Mean |token coefficient|', 'mean |c|'),
    'diag/shared_residual': ('Cancellation residual on shared tokens', 'residual (0 = cancels)'),
    'diag/shared_net_share': ('Net shared-token gradient', 'share of gradient mass'),
    'diag/shared_energy': ('Gradient mass on shared tokens', 'share of gradient mass'),
    'diag/shared_frac': ('Shared tokens', 'fraction of tokens'),
}
_PREFIXES = {
    'eval': 'Held-out',
    'diag': 'Diagnostic',
    'adv': 'Advantages',
    'compute': 'Compute',
    'delta': 'DelTA',
    'format': 'Format'
}
_PATTERNS = (
    (re.compile(r'eval/avg@(\d+)'), lambda m: (f'Held-out accuracy (avg@{m[1]})', 'accuracy')),
    (re.compile(r'eval/pass@(\d+)'), lambda m: (f'Held-out pass@{m[1]} (unbiased)', 'pass@k')),
    (re.compile(r'eval/format/(\w+)'), lambda m:
     (f"Held-out share of the '{m[1]}' format", 'fraction of correct')),
    (re.compile(r'format/(\w+)'), lambda m:
     (f"Share of the '{m[1]}' format", 'fraction of correct')),
    (re.compile(r'eval/probe/format_logq/(\w+) - eval/probe/format_logq/(\w+)'), lambda m:
     (f"Exact log-odds of '{m[1]}' vs '{m[2]}'", 'log q_a - log q_b (nats)')),
    (re.compile(r'diag/energy_b(\d+)'), lambda m:
     (f'Gradient energy in frequency bucket {m[1]} (b0 = frequent)', 'share of energy')),
)
_SPARSE_MAX_POINTS = 25  # a curve with at most this many points, or logged at step gaps > 1,
# is sparse: markers, no smoothing


def describe(key):
  """(title, y-label) of a metric key: the KNOWN_KEYS table, a pattern, or a readable fallback.

  The fallback turns 'diag/shared_frac' into ('Diagnostic: shared frac', 'diag/shared_frac'),
  so an unknown key still reads as words and its y-label names the exact key.
  """
  if key in KNOWN_KEYS:
    return KNOWN_KEYS[key]
  for pattern, make in _PATTERNS:
    m = pattern.fullmatch(key)
    if m:
      return make(m)
  head, _, tail = key.rpartition('/')
  words = tail.replace('_', ' ').strip() or key
  prefix = ' '.join(_PREFIXES.get(p, p) for p in head.split('/') if p)
  title = f'{prefix}: {words}' if prefix else words[:1].upper() + words[1:]
  return title, key


def series(records, key):
  """(steps, values) of `key` over the records that have a finite number for it."""
  pts = [(r['step'], r[key]) for r in records if isinstance(r.get(key), (int, float)) and
         not isinstance(r.get(key), bool) and np.isfinite(r[key])]
  if not pts:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pts)
  return np.asarray(steps), np.asarray(values, np.float64)


def is_sparse(steps):
  """True for curves logged rarely (evaluations): few points or step gaps above 1."""
  if len(steps) <= _SPARSE_MAX_POINTS:
    return True
  return float(np.median(np.diff(steps))) > 1


def run_labels(workdirs):
  """Shortest path suffix of each workdir that no other workdir shares.

  ['x/a/seed0', 'x/b/seed0', 'x/seed1'] -> ['a/seed0', 'b/seed0', 'seed1']. The same
  directory given twice gets ' (2)', ' (3)', ... so both curves stay in the legend.
  """
  parts = [os.path.abspath(w).strip(os.sep).split(os.sep) for w in workdirs]
  labels = []
  for i, p in enumerate(parts):
    others = [q for j, q in enumerate(parts) if j != i and q != p]
    k = 1
    while k < len(p) and any(q[-k:] == p[-k:] for q in others):
      k += 1
    labels.append('/'.join(p[-k:]))
  seen = {}
  for i, label in enumerate(labels):
    seen[label] = seen.get(label, 0) + 1
    if seen[label] > 1:
      labels[i] = f'{label} ({seen[label]})'
  return labels


def available_keys(runs):
  """Sorted keys with at least one finite number in some run (what `--keys` may name)."""
  return sorted({
      k for recs in runs.values() for r in recs for k, v in r.items()
      if k != 'step' and isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
  })


def _read_runs(workdirs):
  runs = {}
  for w, label in zip(workdirs, run_labels(workdirs)):
    path = os.path.join(w, 'metrics.jsonl')
    if not os.path.exists(path):
      raise FileNotFoundError(f'{w!r} has no metrics.jsonl: is it a jtc.train workdir?')
    runs[label] = metric_writer.read_jsonl(path)
  return runs


def _select_keys(keys, runs):
  """Explicit keys: all must exist (ValueError listing valid ones). None: the defaults present."""
  valid = available_keys(runs)
  if keys is None:
    eval_keys = [k for k in valid if k.startswith('eval/avg@')]
    return eval_keys + [k for k in DEFAULT_KEYS if k in valid]
  keys = list(keys)
  unknown = [k for k in keys if k not in valid]
  if unknown:
    raise ValueError(f'unknown metric keys {unknown}: no run logs them; valid keys in these '
                     f'metrics.jsonl files: {valid}')
  if not keys:
    raise ValueError(f'no metric keys to plot; valid keys in these metrics.jsonl files: {valid}')
  return keys


def styles(n):
  """One (colour, line style) per run: tab10 colours, then dashed, then dotted."""
  return [(plt.cm.tab10(i % 10), ('-', '--', ':')[i // 10 % 3]) for i in range(n)]


def _draw_panel(ax, key, runs, run_styles, smooth):
  for (name, recs), (color, ls) in zip(runs.items(), run_styles):
    x, y = series(recs, key)
    if not len(x):
      continue
    if is_sparse(x):
      ax.plot(x, y, color=color, ls=ls, lw=1.4, marker='o', ms=3.5)
    elif smooth > 1:
      ax.plot(x, y, color=color, ls='-', lw=0.8, alpha=0.25)
      ax.plot(x, curves.trailing_mean(y, smooth), color=color, ls=ls, lw=1.5)
    else:
      ax.plot(x, y, color=color, ls=ls, lw=1.2)
  title, ylabel = describe(key)
  ax.set_title(title, fontsize=9)
  ax.set_ylabel(ylabel, fontsize=8)
  ax.set_xlabel('RL step', fontsize=8)
  ax.tick_params(labelsize=7)
  ax.ticklabel_format(axis='y', style='sci', scilimits=(-3, 4))
  ax.yaxis.get_offset_text().set_fontsize(7)
  ax.grid(alpha=0.25, lw=0.5)


def make_figure(runs, keys=None, *, smooth=1):
  """The curves figure of `runs` ({label: metrics records}); see `plot_runs` for the arguments."""
  if isinstance(smooth, bool) or not isinstance(smooth, (int, np.integer)) or smooth < 1:
    raise ValueError(f'smooth must be an integer >= 1 (1 = no smoothing), got {smooth!r}')
  keys = _select_keys(keys, runs)
  n_cols = min(3, len(keys))
  n_rows = (len(keys) + n_cols - 1) // n_cols
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.4 * n_cols, 3.1 * n_rows), squeeze=False)
  run_styles = styles(len(runs))
  for ax, key in zip(axes.flat, keys):
    _draw_panel(ax, key, runs, run_styles, smooth)
  empty = list(axes.flat)[len(keys):]
  for ax in empty:
    ax.axis('off')
  handles = [mlines.Line2D([], [], color=c, ls=ls, lw=1.5) for c, ls in run_styles]
  fig.tight_layout(h_pad=1.2)
  if empty and len(runs) <= 8 * len(empty):  # an unused panel slot holds the legend
    empty[0].legend(handles, list(runs), loc='center left', fontsize=8, frameon=False, title='runs',
                    title_fontsize=8)
  else:  # below all panels, outside every axes
    ncol = min(len(runs), 3 if max(map(len, runs)) > 30 else 5)
    fig.legend(handles, list(runs), loc='upper center', bbox_to_anchor=(0.5, 0.0), ncol=ncol,
               fontsize=8, frameon=False)
  if smooth > 1:
    fig.text(
        0.5, 1.0, f'trailing mean of {smooth} points, raw values faint; '
        'sparse curves (markers) unsmoothed', ha='center', va='bottom', fontsize=7, color='0.35')
  return fig


def plot_runs(workdirs, out, keys=None, *, smooth=1):
  """Draws `keys` of each run to the PNG `out` and returns `out`.

  Args:
    workdirs: `jtc.train` workdirs (each with a metrics.jsonl), named in the legend by
      `run_labels`.
    out: the PNG path.
    keys: metric keys, one panel each (default: held-out accuracy and the DEFAULT_KEYS that
      some run logs); a key no run logs is a ValueError listing the valid keys.
    smooth: trailing-mean window in logged points (1 = raw curves only).
  """
  fig = make_figure(_read_runs(workdirs), keys, smooth=smooth)
  fig.savefig(out, dpi=110, bbox_inches='tight')
  plt.close(fig)
  return out


def plot_token_clouds(workdirs, out):
  """Bar charts of the tokens with the highest and lowest mean DelTA lambda, one row per run.

  Reads `token_cloud.json` written by the trainer for `delta` runs; returns None if no run has
  one.
  """
  clouds = {}
  for w, label in zip(workdirs, run_labels(workdirs)):
    path = os.path.join(w, 'token_cloud.json')
    if os.path.exists(path):
      clouds[label] = files.read_json(path, keys=('top', 'bottom'), expected="DelTA's token cloud")
  if not clouds:
    return None
  fig, axes = plt.subplots(len(clouds), 2, figsize=(10, 2.8 * len(clouds)), squeeze=False)
  for row, (name, cloud) in zip(axes, clouds.items()):
    for ax, side, color in zip(row, ('top', 'bottom'), ('tab:green', 'tab:red')):
      items = cloud[side]
      ax.bar(range(len(items)), [it['mean_lambda'] for it in items], color=color)
      ax.set_xticks(range(len(items)), [repr(it['token'])[1:-1] for it in items], fontsize=7)
      ax.set_ylim(
          min([it['mean_lambda'] for it in items] + [1.0]) - 0.05,
          max([it['mean_lambda'] for it in items] + [1.0]) + 0.05)
      ax.set_title(f'{name}: {side} tokens by mean lambda', fontsize=9)
      ax.set_ylabel('mean lambda', fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def plot_workdirs(workdirs, out, keys=None, *, smooth=1):
  """`plot_runs` of the runs in ``workdirs`` (a population's workdir stands for its members) to
  ``out``, and for DelTA runs their token clouds to ``<out>_tokens.png``; returns the paths
  written."""
  runs = [d for w in workdirs for d in metric_writer.run_dirs(w)]
  written = [plot_runs(runs, out, keys, smooth=smooth)]
  clouds = plot_token_clouds(runs, os.path.splitext(out)[0] + '_tokens.png')
  return written + ([clouds] if clouds else [])
