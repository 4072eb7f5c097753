"""Per-run summaries: what `experiments/run.py` keeps of a finished run (final metrics, curves,
compute counters, wall time, overrides, command) in ``<results>/<sweep>/runs/<run>__s<seed>.json``,
all that the tables need; a run made by a single process and one made as a population member
have the same format (a member's says ``engine: population``)."""

import gzip
import json
import os
import shlex

import numpy as np

from experiments import common
from jtc.analysis import metric_writer

MAX_CURVE_POINTS = 1000
CURVE_KEYS = ('reward_mean', 'reward_std', 'accuracy', 'entropy', 'asym', 'format/entropy',
              'response_length', 'approx_kl', 'clip_frac_high', 'clip_frac_low', 'asym_gated',
              'coef_mass_vs_gspo', 'frac_traj_gated', 'coef_mass', 'update_norm', 'adam_step_norm',
              'grad_norm', 'learning_rate', 'compute/generated_tokens', 'compute/update_steps',
              'compute/rollouts', 'compute/prompts', 'time_sample', 'time_update')
CURVE_PATTERNS = ('eval/', 'energy', 'diag/', 'delta/', 'mismatch/', 'correction/', 'lag/',
                  'credit/', 'flip/', 'mass/')


def read_metrics(workdir):
  """Records of `<workdir>/metrics.jsonl` (a torn last line is ignored)."""
  return metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))


def _is_number(v):
  return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def keeps_curve(key):
  """Whether a summary keeps the curve of metric `key` (a table or plot can read only those)."""
  return key in CURVE_KEYS or any(p in key for p in CURVE_PATTERNS)


def extract_curves(records, *, max_points=MAX_CURVE_POINTS):
  """{key: {'step': [...], 'value': [...]}} for the tracked keys, at most `max_points` each."""
  curves = {}
  for r in records:
    for k, v in r.items():
      if k != 'step' and keeps_curve(k) and _is_number(v):
        c = curves.setdefault(k, {'step': [], 'value': []})
        c['step'].append(r['step'])
        c['value'].append(v)
  for c in curves.values():
    n = len(c['step'])
    if n > max_points:
      idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
      c['step'] = [c['step'][i] for i in idx]
      c['value'] = [c['value'][i] for i in idx]
      c['subsampled_from'] = n
  return curves


def is_finished(records, num_steps):
  return any(r.get('step') == num_steps for r in records)


def make_summary(spec, workdir, records, *, wall_time_s, command):
  final = next((r for r in reversed(records) if r.get('step') == spec.num_steps), records[-1])
  return {
      'sweep': spec.sweep,
      'run': spec.run.name,
      'label': spec.run.label,
      'group': spec.run.group,
      'config': spec.run.config,
      'config_arg': spec.config_arg,
      'seed': spec.seed,
      'num_steps': spec.num_steps,
      'key': spec.key,
      'overrides': {
          k: v for k, v in spec.overrides
      },
      'command': shlex.join(command),
      'workdir': workdir,
      'wall_time_s': wall_time_s,
      'final': {
          k: v for k, v in final.items() if _is_number(v)
      },
      'compute': {
          k: v for k, v in final.items() if k.startswith('compute/')
      },
      'curves': extract_curves(records),
  }


def refresh_curves(results_dir):
  """Re-reads the curves of every summary in `<results_dir>/runs/` from its run's metrics.jsonl,
  for when the curves a summary keeps (CURVE_KEYS, CURVE_PATTERNS) grew after the runs were
  summarised; nothing but 'curves' changes. All or nothing: if a run's metrics are gone or
  unfinished, no summary is written and ValueError names those runs. Returns the number
  refreshed."""
  refreshed, missing = {}, []
  for run_id, path in common.summary_files(results_dir).items():
    summary = common.read_summary(path)
    records = read_metrics(summary['workdir'])
    if not is_finished(records, summary['num_steps']):
      missing.append(f"{run_id} ({summary['workdir']})")
      continue
    refreshed[path] = dict(summary, curves=extract_curves(records))
  if missing:
    raise ValueError(f'cannot refresh curves: no finished metrics.jsonl for {missing}; '
                     'nothing was rewritten')
  for path, summary in refreshed.items():
    write_json(path, summary)
  return len(refreshed)


def summary_path(results_dir, spec):
  """Where ``spec``'s summary is: the file already on disk (compressed or plain), else where it is
  written, `<run id>.json.gz` (`common.SUMMARY_SUFFIXES`)."""
  existing = common.summary_files(results_dir).get(spec.run_id)
  return existing or os.path.join(results_dir, 'runs', f'{spec.run_id}{common.SUMMARY_SUFFIXES[0]}')


def compress(results_dir):
  """Rewrites every plain `runs/<run id>.json` of ``results_dir`` as `<run id>.json.gz` with the
  same content and removes the plain file once its compressed copy reads back equal (the jtc 0.2
  format, CHANGELOG.md). Returns the number compressed."""
  n = 0
  for path in common.summary_files(results_dir).values():
    if path.endswith('.gz'):
      continue
    summary = common.read_summary(path)
    write_json(path + '.gz', summary)
    if common.read_summary(path + '.gz') != summary:
      raise ValueError(f'{path}.gz does not read back as {path}; kept both')
    os.remove(path)
    n += 1
  return n


def find_same_run(results_dir, spec):
  """A finished summary of `spec`'s exact settings (same key) in a sibling sweep, or None.

  Runs are identified by their settings, not their sweep: table2 and table3 compare DFPO and
  GSPO runs that table1 already made, with the same config, overrides and seeds.
  """
  own = os.path.abspath(results_dir)
  root = os.path.dirname(own)
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    other = os.path.join(root, name)
    if other == own or not os.path.isdir(os.path.join(other, 'runs')):
      continue
    for s in common.load_summaries(other):
      if s.get('key') == spec.key and s.get('seed') == spec.seed:
        return s
  return None


def reuse_summary(summary, spec):
  """`summary` relabelled as `spec`'s run of `spec.sweep`, remembering where it was made."""
  return dict(summary, sweep=spec.sweep, run=spec.run.name, label=spec.run.label,
              group=spec.run.group, reused_from=summary.get('reused_from', summary['sweep']))


def write_json(path, obj):
  """``obj`` as JSON at ``path`` (gzip-compressed for a '.gz' path, with no time stamp, so the
  same summary gives the same bytes), written to a temporary file and renamed into place."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  data = json.dumps(obj, indent=1).encode()
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    if path.endswith('.gz'):
      with gzip.GzipFile(filename='', mode='wb', fileobj=f, mtime=0) as z:
        z.write(data)
    else:
      f.write(data)
  os.replace(tmp, path)
