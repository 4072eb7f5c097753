"""The figures of the results files: a sweep's curves (mean over seeds +- one standard error per
run; titles and styles from `jtc.analysis.curve_plots`) and the claims' forest plot."""

import os

import numpy as np

from experiments.common import curve
from jtc.analysis import curve_plots


def plot_curves(sweep, summaries, out_path):
  """Mean over seeds +- one standard error, per run label (and group), for the sweep's
  curve_keys and held-out accuracy; titles and styles from `jtc.analysis.curve_plots`."""
  plt = curve_plots.plt
  keys = list(sweep.curve_keys) + ['eval/avg@']
  n_cols = 3
  n_rows = (len(keys) + n_cols - 1) // n_cols
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.4 * n_cols, 3.0 * n_rows), squeeze=False)
  runs = list(dict.fromkeys((r.group, r.label) for r in sweep.runs))
  for ax, key in zip(axes.flat, keys):
    shown = key
    for (group, label), (color, ls) in zip(runs, curve_plots.styles(len(runs))):
      xs, ys = [], []
      for s in summaries:
        if s['label'] != label or s.get('group', '') != group:
          continue
        steps, v = curve(s, key)
        if v is None:
          continue
        if sweep.plot_x != 'step':
          cs, cv = curve(s, sweep.plot_x)
          if cv is None:
            continue
          steps = np.interp(steps, cs, cv)
        xs.append(steps)
        ys.append(v)
        shown = key if not key.endswith('@') else next(
            (k for k in sorted(s['curves']) if k.startswith(key)), key)
      if not ys:
        continue
      n = min(len(y) for y in ys)
      x = np.mean([x[:n] for x in xs], axis=0)
      y = np.array([y[:n] for y in ys])
      mean = y.mean(0)
      se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(mean)
      marker = 'o' if curve_plots.is_sparse(x) else None
      ax.plot(x, mean, lw=1.2, color=color, ls=ls, marker=marker, ms=3,
              label=f'{label} {group}'.strip())
      ax.fill_between(x, mean - se, mean + se, color=color, alpha=0.2, lw=0)
    title, ylabel = curve_plots.describe(shown)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlabel('generated tokens' if sweep.plot_x != 'step' else 'RL step', fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25, lw=0.5)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis('off')
  handles, labels = [], []
  for ax in axes.flat:
    h, l = ax.get_legend_handles_labels()
    if len(h) > len(handles):
      handles, labels = h, l
  if handles:
    fig.legend(handles, labels, loc='lower center', ncol=min(len(labels), 4), fontsize=8)
  fig.tight_layout(rect=(0, 0.04 + 0.025 * ((len(labels) + 3) // 4), 1, 1))
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path


_COLORS = {'agrees': 'tab:green', 'disagrees': 'tab:red', 'equivalent': 'tab:blue'}


def forest(rows, path, title):
  """Delta and 95% CI per claim, one panel per family (its own units), the paper's delta as a
  cross, each claim's +-SESOI band shaded, 0 as a line; a claim without data says so."""
  plt = curve_plots.plt
  families = list(dict.fromkeys(r['family'] for r in rows))
  heights = [max(1.2, 0.42 * sum(r['family'] == f for r in rows) + 0.8) for f in families]
  fig, axes = plt.subplots(len(families), 1, figsize=(8.5, sum(heights)), squeeze=False,
                           gridspec_kw={'height_ratios': heights})
  for ax, family in zip(axes[:, 0], families):
    members = [r for r in rows if r['family'] == family][::-1]
    y = np.arange(len(members))
    ax.axvline(0, color='0.4', lw=0.8)
    for i, r in enumerate(members):
      if np.isfinite(r['sesoi']):
        ax.add_patch(plt.Rectangle((-r['sesoi'], i - 0.4), 2 * r['sesoi'], 0.8, color='0.85', lw=0))
      if not r['n_seeds']:
        ax.text(0, i, ' no data (not run) ', ha='center', va='center', fontsize=7, color='0.3')
      color = _COLORS.get(r['verdict'].split(' ')[0].rstrip(':'), 'tab:gray')
      if np.isfinite(r['ci_low']):
        ax.plot([r['ci_low'], r['ci_high']], [i, i], color=color, lw=2)
      ax.plot(r['delta'], i, 'o', color=color, ms=5)
      if np.isfinite(r['paper_delta']):
        ax.plot(r['paper_delta'], i, 'x', color='k', ms=7, mew=1.5)
    ax.set_yticks(y)
    ax.set_yticklabels([
        f'{r["claim"]}: {r["comparison"]}' + (f' [{r["platform"]}]' if r.get('platform') else '')
        for r in members
    ], fontsize=8)
    unit = members[0]['unit']
    ax.set_title(family + (f' ({unit})' if unit else ''), fontsize=9, loc='left')
    ax.tick_params(axis='x', labelsize=8)
    ax.grid(axis='x', alpha=0.3)
    ax.set_ylim(-0.7, len(members) - 0.3)
  handles = [
      plt.Line2D([], [], color='tab:green', marker='o', label='agrees (the predicted sign)'),
      plt.Line2D([], [], color='tab:red', marker='o', label='disagrees'),
      plt.Line2D([], [], color='tab:blue', marker='o', label='equivalent (within +-SESOI)'),
      plt.Line2D([], [], color='tab:gray', marker='o', label='inconclusive'),
      plt.Line2D([], [], color='k', marker='x', ls='', label="paper's delta (another scale)"),
      plt.Rectangle((0, 0), 1, 1, color='0.85', label='+-SESOI')
  ]
  fig.legend(handles=handles, loc='lower center', ncol=3, fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0.06, 1, 0.97))
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
