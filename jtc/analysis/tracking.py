"""Weights & Biases tracking: each metric stream (`metric_writer.MetricWriter`) mirrored to a W&B run.

  python -m jtc.train --config configs/gspo.py --workdir W --config.log.wandb_project=P

Config (`configs/common.py`, section `log`): `wandb_project` ('' = off), `wandb_entity`,
`wandb_run_name` ('' = the workdir's name), `wandb_tags` ('a,b'), `wandb_mode` ('' = $WANDB_MODE
when set, else online with an API key and offline without one; 'online' without a key is refused).

A run directory (the workdir, or each population member's ``members/<name>/``) holds its W&B
files in ``<dir>/wandb/`` and `STATE_FILE` there: the W&B run's id. A resumed run continues
that W&B run and logs only the steps after the last one it holds (the server's, online; the
last one written to its offline files, offline); records of metrics.jsonl it lacks (W&B switched
on for a resumed run, steps a SIGKILL lost) are logged first, so the W&B run holds the same
records as metrics.jsonl, at the same steps, each once. The members of a population are one W&B run
each, grouped under the run name. `wandb` is imported only when a run starts (`pip install
-e ".[wandb]"` in the checkout); `offline_history` reads an offline run back with wandb's own reader.
"""

import datetime
import importlib.util
import json
import math
import netrc
import os
import secrets
import string
import subprocess
import sys
import time
import urllib.parse

from jtc import checks
from jtc import files

MODES = ('', 'online', 'offline', 'disabled')  # '' = auto (`resolve_mode`)
EXTRA = 'wandb'  # setup.py's extra that installs the package
STATE_FILE = 'jtc_run.json'  # in <dir>/wandb/: {'id', 'project', 'entity'} of its W&B run
NONFINITE = {'nan': math.nan, 'inf': math.inf, '-inf': -math.inf}  # as metrics.jsonl writes them
WANDB_NONFINITE = {'NaN': math.nan, 'Infinity': math.inf, '-Infinity': -math.inf}  # its JSON
DEFAULT_HOST = 'https://api.wandb.ai'


def installed():
  """Whether the wandb package can be imported (without importing it)."""
  return importlib.util.find_spec('wandb') is not None


def has_api_key(environ=None):
  """Whether W&B credentials are at hand: $WANDB_API_KEY, $WANDB_IDENTITY_TOKEN_FILE, or a
  netrc entry (`wandb login` writes one; $NETRC, else ~/.netrc) for $WANDB_BASE_URL's host."""
  environ = os.environ if environ is None else environ
  if environ.get('WANDB_API_KEY') or environ.get('WANDB_IDENTITY_TOKEN_FILE'):
    return True
  path = environ.get('NETRC') or os.path.expanduser('~/.netrc')
  host = urllib.parse.urlsplit(environ.get('WANDB_BASE_URL') or DEFAULT_HOST).hostname
  try:
    entry = netrc.netrc(path).authenticators(host)
  except (OSError, netrc.NetrcParseError):
    return False
  return bool(entry and entry[2])


def resolve_mode(mode, environ=None):
  """The W&B mode of `log.wandb_mode`: itself when set; '' reads $WANDB_MODE, else 'online'
  with credentials (`has_api_key`) and 'offline' without. A ValueError for 'online' without
  credentials (never a silent fallback to offline) or a bad $WANDB_MODE."""
  environ = os.environ if environ is None else environ
  checks.choice('config.log.wandb_mode', mode, MODES)
  source = 'config.log.wandb_mode'
  if not mode and environ.get('WANDB_MODE'):
    mode, source = environ['WANDB_MODE'], 'WANDB_MODE'
    checks.choice('$WANDB_MODE', mode, MODES[1:])
  if not mode:
    return 'online' if has_api_key(environ) else 'offline'
  if mode == 'online' and not has_api_key(environ):
    raise ValueError(f'{source}=\'online\' but no W&B API key is set (WANDB_API_KEY, or '
                     '`wandb login`); log in, or use wandb_mode=offline and `wandb sync` later')
  return mode


def enabled(log):
  """Whether the config's `log` section asks for W&B (a project, and a mode other than
  'disabled')."""
  return bool(log.wandb_project) and log.wandb_mode != 'disabled'


def tags(log):
  """`log.wandb_tags` 'a, b' -> ['a', 'b']."""
  return [t.strip() for t in log.wandb_tags.split(',') if t.strip()]


def check_config(log, environ=None, *, primary=True):
  """The W&B keys of the `log` section, before any compute: the mode and, when W&B is on, in
  the process that logs (``primary``: process 0), the credentials 'online' needs and the
  package (naming the extra)."""
  checks.choice('config.log.wandb_mode', log.wandb_mode, MODES)
  if not enabled(log) or not primary:
    return
  resolve_mode(log.wandb_mode, environ)
  if not installed():
    raise ValueError(f'config.log.wandb_project={log.wandb_project!r} needs the wandb package, '
                     f'which is not installed: pip install -e ".[{EXTRA}]" in the jtc checkout (or '
                     'pip install wandb; or set config.log.wandb_project=\'\' to train without '
                     'W&B)')


def _state_path(run_dir):
  return os.path.join(run_dir, 'wandb', STATE_FILE)


def _write_state(path, state):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(state, f)
  os.replace(tmp, path)


def _wait_for_a_new_second(wandb_dir, run_id):
  """Returns once no directory of run ``run_id`` in ``wandb_dir`` bears the current second:
  wandb names a start's directory '<mode>-run-<local time to the second>-<id>', so a second
  start within the same second would write into the first's."""
  while True:
    stamp = datetime.datetime.now().strftime('%Y%m%d_%H%M%S')
    if not any(n.endswith(f'-{stamp}-{run_id}') for n in os.listdir(wandb_dir)):
      return
    time.sleep(0.05)


def new_run_id():
  """A fresh W&B run id: 8 random lowercase letters and digits, as W&B's own."""
  alphabet = string.ascii_lowercase + string.digits
  return ''.join(secrets.choice(alphabet) for _ in range(8))


def for_wandb(record):
  """A metrics.jsonl record as W&B logs it: the step apart, non-finite values as floats."""
  return {
      k: NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items() if k != 'step'
  }


class Tracker:
  """One W&B run mirroring one metric stream; `log` a record, `finish` at the end."""

  def __init__(self, run, held_through=-1):
    self.run = run
    # The last step the W&B run holds: the server's (online), else the last one written to
    # this run's offline files (a SIGKILL loses the steps wandb's service had not yet written).
    self.held_through = held_through

  @classmethod
  def start(cls, run_dir, log, *, config, name, group=None):
    """Starts (or resumes, with the id in ``run_dir``/wandb/`STATE_FILE`) the W&B run of the
    metric stream in ``run_dir``; ``config`` is logged as the run's config."""
    import wandb  # pylint: disable=import-outside-toplevel
    os.makedirs(os.path.join(run_dir, 'wandb'), exist_ok=True)
    path = _state_path(run_dir)
    state = files.read_json(
        path, expected='the W&B run of this directory') if os.path.exists(path) else {}
    if (state.get('project'), state.get('entity')) != (log.wandb_project, log.wandb_entity):
      state = {}  # another project: a new W&B run, every record logged again
    state = {
        'id': state.get('id') or new_run_id(),
        'project': log.wandb_project,
        'entity': log.wandb_entity
    }
    mode = resolve_mode(log.wandb_mode)
    earlier = offline_dirs(run_dir, state['id'])  # before this start adds its own
    _wait_for_a_new_second(os.path.dirname(path), state['id'])
    run = wandb.init(project=log.wandb_project, entity=log.wandb_entity or None, name=name,
                     group=group, tags=tags(log), config=config, id=state['id'], resume='allow',
                     dir=run_dir, mode=mode, reinit='create_new',
                     settings=wandb.Settings(console='off'))
    try:
      held = (run.starting_step -
              1 if run.resumed else -1) if mode == 'online' else (_last_step(earlier))
    except BaseException:
      run.finish(exit_code=1)
      raise
    _write_state(path, state)
    print(
        f'W&B: {mode} run {name!r} (id {state["id"]}) in {os.path.dirname(path)}' +
        (f'; upload it with `wandb sync {run.settings.sync_dir}`' if mode == 'offline' else ''),
        file=sys.stderr)
    return cls(run, held)

  def log(self, record, tables=None):
    """Logs a metrics.jsonl record at its step, with ``tables`` ({name: {'columns', 'data'}}) as
    W&B tables, unless the W&B run already holds that step (a step recomputed after a resume)."""
    step = record['step']
    if step <= self.held_through:
      return
    payload = for_wandb(record)
    if tables:
      import wandb  # pylint: disable=import-outside-toplevel
      payload.update({
          k: wandb.Table(columns=t['columns'], data=t['data']) for k, t in tables.items()
      })
    self.run.log(payload, step=step, commit=True)
    self.held_through = step

  def finish(self, exit_code=0):
    self.run.finish(exit_code=exit_code)


def start_runs(log, run_dirs, *, revision, workdir):
  """A `Tracker` per run directory (the members of a population grouped under the run name,
  each run named '<name>/<member>'), or Nones when W&B is off. Each run's config is its
  directory's config.json (the member's own for a member) with the code revision
  (``revision()``, e.g. `distributed.code_revision`)."""
  if not enabled(log) or not run_dirs or resolve_mode(log.wandb_mode) == 'disabled':
    return [None] * len(run_dirs)  # off, another process's, or $WANDB_MODE=disabled
  revision = revision()
  name = log.wandb_run_name or os.path.basename(os.path.abspath(workdir))
  trackers = []
  try:
    for d in run_dirs:
      config = dict(
          files.read_json(os.path.join(d, 'config.json'), keys=('config',))['config'],
          code_revision=revision)
      member = len(run_dirs) > 1
      trackers.append(
          Tracker.start(d, log, config=config,
                        name=f'{name}/{os.path.basename(d)}' if member else name,
                        group=name if member else None))
  except BaseException:
    for t in trackers:
      t.finish(exit_code=1)
    raise
  return trackers


def offline_dirs(run_dir, run_id):
  """The offline-run-<time>-<id> directories of W&B run ``run_id`` in ``run_dir``/wandb, one
  per start, oldest first."""
  base = os.path.join(run_dir, 'wandb')
  names = os.listdir(base) if os.path.isdir(base) else []
  return [
      os.path.join(base, n)
      for n in sorted(names)
      if n.startswith('offline-run-') and n.endswith(f'-{run_id}')
  ]


def read_run_log(path):
  """The records of one start's .wandb transaction log (a directory of `offline_dirs`), as
  wandb's own reader prints them (`wandb leet inspect --json`: dicts with 'type' 'run',
  'history', 'summary', ...); a log cut by a kill is read up to the cut."""
  proc = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', path],
                        capture_output=True, text=True, check=True, timeout=120)
  return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _last_step(dirs):
  """The last step logged in the newest of ``dirs`` that holds any step (-1: none)."""
  for path in reversed(dirs):
    steps = [r['step'] for r in history(read_run_log(path))]
    if steps:
      return max(steps)
  return -1


def offline_records(run_dir, run_id=None):
  """Every record of ``run_dir``'s offline W&B run ``run_id`` (default: `STATE_FILE`'s), all
  its starts in order (`read_run_log` of each of `offline_dirs`)."""
  run_id = run_id or files.read_json(_state_path(run_dir), keys=('id',))['id']
  return [r for path in offline_dirs(run_dir, run_id) for r in read_run_log(path)]


def _media(item):
  """The W&B media objects of a history item (tables), {key: {'_type', 'path', ...}}: wandb's log
  holds a table's fields flattened ('samples._type', 'samples.path', ...) or as one dict."""
  out = {k: v for k, v in item.items() if isinstance(v, dict) and '_type' in v}
  for k in item:
    if k.endswith('._type'):
      key = k[:-len('._type')]
      out[key] = {f[len(key) + 1:]: x for f, x in item.items() if f.startswith(key + '.')}
  return out


def history(records):
  """The metrics of W&B records (`offline_records`): {'step': s, **metrics} per step logged,
  without W&B's '_' keys and its tables (`offline_tables`), non-finite values as floats."""
  out = []
  for r in records:
    if r.get('type') == 'history':
      record = {'step': int(r['history'].get('step', {}).get('num', 0))}
      item = r['history']['item']
      media = _media(item)
      for k, v in item.items():
        if not k.startswith('_') and k not in media and not any(
            k.startswith(m + '.') for m in media):
          record[k] = WANDB_NONFINITE.get(v, v) if isinstance(v, str) else v
      out.append(record)
  return out


def offline_tables(run_dir, name, run_id=None):
  """The W&B tables ``name`` of ``run_dir``'s offline run, read back from the files wandb wrote:
  ``[{'step', 'columns', 'data'}, ...]`` in the order logged."""
  run_id = run_id or files.read_json(_state_path(run_dir), keys=('id',))['id']
  out = []
  for path in offline_dirs(run_dir, run_id):
    for r in read_run_log(path):
      if r.get('type') != 'history':
        continue
      value = _media(r['history']['item']).get(name)
      if value:
        with open(os.path.join(path, 'files', value['path']), encoding='utf-8') as f:
          logged = json.load(f)
        out.append({
            'step': int(r['history'].get('step', {}).get('num', 0)),
            'columns': logged['columns'],
            'data': logged['data']
        })
  return out


def offline_history(run_dir, run_id=None):
  """The metrics logged to ``run_dir``'s offline W&B runs (`history` of `offline_records`)."""
  return history(offline_records(run_dir, run_id))
