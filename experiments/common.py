"""What the results files' modules share (tables: `report`, figures: `figures`, claims:
`verdicts`): reading the per-run summaries and their curves, the per-run values a table or a
claim takes from them, how values are written, and the code revision. It imports nothing else
from experiments/, so everything above it imports it and nothing imports back.
"""

import gzip
import json
import os
import re
import subprocess

import numpy as np

from jtc import files
from jtc.analysis import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def results_dir(root=ROOT, cwd=None):
  """Where results files go by default: the repository's experiments/results in a checkout;
  in an installed package (`pip install .`, no results folder beside the code) the working
  directory's experiments/results, never the site-packages folder."""
  committed = os.path.join(root, 'experiments', 'results')
  if os.path.isdir(committed):
    return committed
  return os.path.join(cwd or os.getcwd(), 'experiments', 'results')


SMOOTH_STEPS = 5  # trailing mean of the reward before compute_at_threshold

# ---------------------------------------------------------------------------------------------
# Per-run scalars: '<extractor>:<key>' (a key ending in '@' = the first curve starting with it).
# ---------------------------------------------------------------------------------------------


def curve(summary, key):
  """(steps, values) float64 arrays of a summary's curve, or (None, None).

  ``'A - B'`` is the difference of two curves logged at the same steps (e.g. the log-odds
  between two equivalent solutions, ``format_logq/a - format_logq/b``).
  """
  if ' - ' in key:
    a, b = (k.strip() for k in key.split(' - ', 1))
    (sa, va), (sb, vb) = curve(summary, a), curve(summary, b)
    if va is None or vb is None:
      return None, None
    if not np.array_equal(sa, sb):
      raise ValueError(f'curves {a!r} and {b!r} are logged at different steps; '
                       f'{key!r} needs the same steps')
    return sa, va - vb
  stored = summary['curves']
  if key.endswith('@'):  # 'eval/avg@' -> 'eval/avg@K'; 'eval/pass@' -> the largest K logged
    matches = [k for k in stored if re.fullmatch(re.escape(key) + r'\d+', k)]
    key = max(matches, key=lambda k: int(k[len(key):])) if matches else key
  c = stored.get(key)
  if not c or not c['value']:
    return None, None
  return np.asarray(c['step'], np.float64), np.asarray(c['value'], np.float64)


def _final(summary, key, **_):
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v[-1])


def _mean(summary, key, **_):
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v.mean())


def _late_mean(summary, key, **_):
  """Mean over the last quarter of the curve (at least one point)."""
  _, v = curve(summary, key)
  return float('nan') if v is None else float(v[-max(len(v) // 4, 1):].mean())


def _change(summary, key, **_):
  """Last value minus first value (e.g. the drift of a log-odds over training)."""
  _, v = curve(summary, key)
  return float('nan') if v is None or len(v) < 2 else float(v[-1] - v[0])


def _jitter2(summary, key, **_):
  _, v = curve(summary, key)
  if v is None or len(v) < 3:
    return float('nan')
  return float(curves.jitter2(v))


def _compute_at(summary, key, *, threshold=None):
  """Generated tokens when `key` first reaches `threshold` (NaN if never)."""
  steps, v = curve(summary, key)
  cs, cv = curve(summary, 'compute/generated_tokens')
  if v is None or cv is None:
    return float('nan')
  compute = np.interp(steps, cs, cv)
  out = float(
      curves.compute_at_threshold(v, compute, threshold, smooth=SMOOTH_STEPS, interpolate=True))
  return out if np.isfinite(out) else float('nan')


EXTRACTORS = {
    'final': _final,
    'mean': _mean,
    'late_mean': _late_mean,
    'change': _change,
    'jitter2': _jitter2,
    'compute_at': _compute_at,
}


def metric_value(summary, metric, **kwargs):
  name, _, key = metric.partition(':')
  if name not in EXTRACTORS:
    raise ValueError(f'unknown metric extractor {name!r} in {metric!r}; valid: '
                     f'{sorted(EXTRACTORS)}')
  return EXTRACTORS[name](summary, key, **kwargs)


def auto_threshold(summaries, key, *, window=SMOOTH_STEPS):
  """0.9 x the smallest per-label seed-mean of the final `window`-step trailing mean of `key`.

  Every method's average run ends above the threshold, so compute-to-threshold is defined for
  most seeds of every method.
  """
  by_label = {}
  for s in summaries:
    _, v = curve(s, key)
    if v is not None:
      by_label.setdefault((s.get('group', ''), s['label']),
                          []).append(curves.trailing_mean(v, window)[-1])
  if not by_label:
    return float('nan')
  return 0.9 * min(float(np.mean(v)) for v in by_label.values())


# ---------------------------------------------------------------------------------------------
# Summaries on disk, the code revision, how values are written.
# ---------------------------------------------------------------------------------------------


def code_revision():
  """'<sha>' or '<sha> (dirty)'; 'unknown' outside a git checkout or without commits. Only
  code counts as dirty: results files (experiments/results/) being rewritten do not."""
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dirty = subprocess.run([
        'git', 'status', '--porcelain', '--untracked-files=no', '--', '.', ':!experiments/results'
    ], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return f'{sha} (dirty)' if dirty else sha


def platform():
  """'GPU (<name>)' when `nvidia-smi` names a GPU, else 'CPU' ($JTC_PLATFORM overrides): where a
  sweep's runs ran, for its invocation.json. The runner never initialises jax itself (on a GPU
  that would take device memory from the trainers)."""
  if os.environ.get('JTC_PLATFORM'):
    return os.environ['JTC_PLATFORM']
  try:
    names = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                           capture_output=True, text=True, check=True,
                           timeout=30).stdout.split('\n')
  except (OSError, subprocess.SubprocessError):
    return 'CPU'
  names = [n.strip() for n in names if n.strip()]
  return f'GPU ({names[0]})' if names else 'CPU'


def fmt_value(value):
  """How a config value is written on a command line (floats by repr: 1e-4 stays 1e-4)."""
  return repr(value) if isinstance(value, float) else str(value)


# A per-run summary is `<results>/<sweep>/runs/<run id>.json.gz`: gzip-compressed JSON (its
# curves make up most of it; compressed, the committed results take a quarter of the space).
# Summaries written before jtc 0.2 are plain `<run id>.json` and read the same.
SUMMARY_SUFFIXES = ('.json.gz', '.json')


def summary_name(fname):
  """The run id of a summary's file name, or None for any other file."""
  for suffix in SUMMARY_SUFFIXES:
    if fname.endswith(suffix):
      return fname[:-len(suffix)]
  return None


# What every per-run summary holds (experiments.summaries.make_summary writes it).
SUMMARY_KEYS = ('run', 'seed', 'num_steps', 'key', 'workdir', 'final', 'curves')


def read_summary(path):
  """One per-run summary, gzip-compressed or plain JSON by its suffix (`files.DamagedFile` when it
  is not one: empty, cut off, not JSON, keys missing)."""
  expected = 'a run summary'
  data = files.read_bytes(path, expected)
  if path.endswith('.gz'):
    with files.reading(path, f'{expected} (gzip-compressed JSON)'):
      data = gzip.decompress(data)
  obj = files.parse_json(path, files.decode_text(path, data, expected), expected)
  return files.check_keys(path, obj, SUMMARY_KEYS, expected)


def summary_files(results_dir):
  """{run id: path} of the summaries in `<results_dir>/runs/`; a run with both a compressed and
  a plain summary is ambiguous (ValueError naming both)."""
  runs_dir = os.path.join(results_dir, 'runs')
  out = {}
  for fname in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
    run_id = summary_name(fname)
    if run_id is None:
      continue
    path = os.path.join(runs_dir, fname)
    if run_id in out:
      raise ValueError(f'two summaries of run {run_id!r}: {out[run_id]} and {path}; keep one')
    out[run_id] = path
  return out


def load_summaries(results_dir):
  """Every per-run summary in `<results_dir>/runs/`, in run-id order."""
  return [read_summary(p) for _, p in sorted(summary_files(results_dir).items())]


def failures_on_disk(results_dir):
  runs_dir = os.path.join(results_dir, 'runs')
  out = {}
  if os.path.isdir(runs_dir):
    for fname in sorted(os.listdir(runs_dir)):
      if fname.endswith('.failed.txt'):
        with open(os.path.join(runs_dir, fname)) as f:
          out[fname[:-len('.failed.txt')]] = f.read()
  return out


def ci_str(mean, lo, hi, scale, digits):
  if not np.isfinite(mean):
    return 'n/a'
  if not np.isfinite(lo):
    return f'{mean * scale:.{digits}f}'
  return f'{mean * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]'


def p_str(p):
  if not np.isfinite(p):
    return 'n/a'
  return f'{p:.3g}' if p >= 1e-4 else f'{p:.1e}'
