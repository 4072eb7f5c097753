r"""Draws the main training curves of one or more runs on one figure.

  python -m jtc.plot W1 [W2 ...] --out curves.png [--keys reward_mean,entropy,...]

Each W is a workdir of `jtc.train` (its `metrics.jsonl` is read); the legend is the workdir's
base name. A key missing from a run is skipped for that run. For DelTA runs the token clouds
(tokens with the highest / lowest mean lambda) go to `<out>_tokens.png`.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from jtc import metric_writer

DEFAULT_KEYS = ('reward_mean', 'accuracy', 'entropy', 'response_length', 'asym',
                'clip_frac_high', 'approx_kl', 'format/entropy')


def series(records, key):
  """(steps, values) of `key` over the records that have a finite number for it."""
  pts = [(r['step'], r[key]) for r in records
         if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
  if not pts:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pts)
  return np.asarray(steps), np.asarray(values, np.float64)


def plot_runs(workdirs, out, keys=DEFAULT_KEYS):
  runs = {}
  for w in workdirs:
    path = os.path.join(w, 'metrics.jsonl')
    if not os.path.exists(path):
      raise FileNotFoundError(f'{w!r} has no metrics.jsonl: is it a jtc.train workdir?')
    runs[os.path.basename(os.path.normpath(w))] = metric_writer.read_jsonl(path)
  eval_keys = sorted({k for recs in runs.values() for r in recs for k in r
                      if k.startswith('eval/avg@')})
  keys = list(keys) + eval_keys
  n_cols = 3
  n_rows = (len(keys) + n_cols - 1) // n_cols
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.2 * n_cols, 3.0 * n_rows), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    for name, recs in runs.items():
      x, y = series(recs, key)
      if len(x):
        ax.plot(x, y, label=name, lw=1.2)
    ax.set_title(key, fontsize=9)
    ax.set_xlabel('step', fontsize=8)
    ax.tick_params(labelsize=7)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis('off')
  handles, labels = axes.flat[0].get_legend_handles_labels()
  if handles:
    fig.legend(handles, labels, loc='lower center', ncol=min(len(labels), 6), fontsize=8)
  fig.tight_layout(rect=(0, 0.05, 1, 1))
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def plot_token_clouds(workdirs, out):
  """Bar charts of the tokens with the highest and lowest mean DelTA lambda, one row per run.

  Reads `token_cloud.json` written by the trainer for `delta` runs; returns None if no run has
  one.
  """
  clouds = {}
  for w in workdirs:
    path = os.path.join(w, 'token_cloud.json')
    if os.path.exists(path):
      with open(path) as f:
        clouds[os.path.basename(os.path.normpath(w))] = json.load(f)
  if not clouds:
    return None
  fig, axes = plt.subplots(len(clouds), 2, figsize=(10, 2.8 * len(clouds)), squeeze=False)
  for row, (name, cloud) in zip(axes, clouds.items()):
    for ax, side, color in zip(row, ('top', 'bottom'), ('tab:green', 'tab:red')):
      items = cloud[side]
      ax.bar(range(len(items)), [it['mean_lambda'] for it in items], color=color)
      ax.set_xticks(range(len(items)), [repr(it['token'])[1:-1] for it in items], fontsize=7)
      ax.set_ylim(min([it['mean_lambda'] for it in items] + [1.0]) - 0.05,
                  max([it['mean_lambda'] for it in items] + [1.0]) + 0.05)
      ax.set_title(f'{name}: {side} tokens by mean lambda', fontsize=9)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('workdirs', nargs='+')
  parser.add_argument('--out', default='curves.png')
  parser.add_argument('--keys', default=','.join(DEFAULT_KEYS))
  args = parser.parse_args(argv)
  print(plot_runs(args.workdirs, args.out, [k for k in args.keys.split(',') if k]))
  clouds = plot_token_clouds(args.workdirs, os.path.splitext(args.out)[0] + '_tokens.png')
  if clouds:
    print(clouds)


if __name__ == '__main__':
  main()
