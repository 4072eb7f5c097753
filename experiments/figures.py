"""The curves figure of a sweep's results file: mean over seeds +- one standard error per run
(titles and styles from `jtc.analysis.curve_plots`)."""

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
