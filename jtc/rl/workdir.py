"""A workdir holds exactly one run: it is locked while a trainer uses it, it remembers the
config that made it, and a run of another config is never resumed into it by accident.

  claim(workdir, config)           all three, for a trainer that is about to use it (never a
                                   population member's directory)
  lock(workdir)                    an exclusive lock (fcntl) naming the holder's PID, its
                                   file removed when released
  check_writable(workdir)          one clear line for a workdir that is a file or read-only
  check_identity(workdir, config)  compared with the run's config.json on resume (only
                                   RESUMABLE_KEYS may differ); record_config writes it
"""

import errno
import fcntl
import json
import os
import sys

from jtc import checks
from jtc import files

CONFIG_FILE = 'config.json'
LOCK_FILE = '.lock'
MEMBER_FILE = 'member.json'  # marks a population member's directory
# Keys that may change when a run is resumed: they change how long it runs and what it logs,
# never what a step computes. (num_steps keeps the run's original learning-rate schedule.) The
# verifier pool's size and timeout are the machine's (a slower host may need a longer timeout),
# and runs written before they existed lack them.
RESUMABLE_KEYS = ('num_steps', 'token_budget', 'eval.every', 'eval.problems', 'eval.probe_problems',
                  'log.ckpt_every', 'log.keep_checkpoints', 'log.diagnostics_every',
                  'log.progress_every', 'log.ledger_every', 'log.samples_every', 'log.samples',
                  'log.wandb_project', 'log.wandb_entity', 'log.wandb_run_name', 'log.wandb_tags',
                  'log.wandb_mode', 'distributed.coordinator_timeout_s', 'data.verify_workers',
                  'data.verify_timeout_s')
SCHEDULE_KEY = 'schedule_num_steps'  # in config.json: the num_steps the schedule was built for
# Keys that define which members a population has: never changed on resume, even with
# --allow_config_change (the checkpoint would be restored into other members).
POPULATION_KEYS = ('population.size', 'population.vary')
# Keys that define the shapes of what is trained (the LoRA adapters): never changed on resume.
ADAPTER_KEYS = ('lora.rank', 'lora.targets')
# Keys added after runs were recorded: a recorded config without them ran at these values.
ADDED_KEYS = {
    'lora.rank': 0,
    'lora.alpha': 8.0,
    'lora.targets': 'q,k,v,o,gate,up,down',
    'data.reward_signature': 'verl',
    'data.reward_by_source': '',
    'data.question_field': '',
    'data.answer_field': '',
    'data.train_split': '',
    'data.eval_split': '',
    'data.eval_fraction': 0.0,
    'data.split_seed': 0,
    'data.overlong': 'error',
    'mesh.expert': 1,
    'policy.moe_dispatch': 'replicated',
    'optim.minibatch_order': 'group',
    'advantage.sign': 'both',
}
# Keys removed since runs were recorded, with the one value every recorded run had (a recorded
# config with another value is a run this version cannot continue).
REMOVED_KEYS = {'lora.dropout': 0.0}


class WorkdirError(RuntimeError):
  """A workdir that cannot be used for this run (named, with the reason and what to do)."""


def check_writable(workdir):
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f'--workdir={workdir} is a file, not a directory')
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f'--workdir={workdir} cannot be created: {e.strerror}') from None
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise WorkdirError(f'--workdir={workdir} is not writable')


class Lock:
  """An exclusive ``fcntl`` lock on a file that names its holder's PID; ``close()`` removes the
  file, then releases the lock, so nothing is left behind when its holder ends."""

  def __init__(self, path, f):
    self.path, self._file = path, f

  def close(self):
    """Removes the lock file and releases the lock. Idempotent."""
    if self._file is None:
      return
    try:
      os.remove(self.path)
    except FileNotFoundError:
      pass
    self._file.close()
    self._file = None


def lock_file(path, in_use):
  """A `Lock` on ``path`` (created), or ``in_use(holder)``'s error when another process holds it.

  The file is removed on release: a process that opened it just before and locks it after
  holds a removed file, so each attempt checks that the path is still the file it locked, and
  tries again when not."""
  while True:
    f = open(path, 'a+')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      f.seek(0)
      holder = f.read().strip() or 'another process'
      f.close()
      raise in_use(holder) from None
    try:
      same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    f.close()  # released by its holder meanwhile: lock the new file
  f.seek(0)
  f.truncate()
  f.write(f'pid {os.getpid()}')
  f.flush()
  return Lock(path, f)


def lock(workdir):
  """Holds an exclusive lock on the workdir until the returned `Lock` is closed (which removes
  its file); a second trainer on the same workdir gets a WorkdirError naming the first one's
  PID."""
  return lock_file(
      os.path.join(workdir, LOCK_FILE), lambda holder: WorkdirError(
          f'--workdir={workdir} is in use by {holder}; two runs in one workdir would corrupt each '
          'other (wait for it, or use another --workdir)'))


def check_identity(workdir, config, *, allow_changes=False, has_checkpoint):
  """Compares the config with the one recorded in the workdir (nothing is written here).

  Returns the num_steps the learning-rate schedule must keep (the original run's, so that
  raising num_steps on resume extends the run at the final learning rate instead of jumping
  back up the cosine). Raises WorkdirError naming the differing keys when the workdir holds a
  run of another config, unless ``allow_changes``.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    if has_checkpoint:
      raise WorkdirError(f'--workdir={workdir} has checkpoints but no {CONFIG_FILE}: it was '
                         'written by another version of jtc; use another --workdir')
    return config.num_steps
  stored = files.read_json(path, keys=('config',), expected='the config of the run in this workdir')
  old = {**ADDED_KEYS, **checks.flatten(stored['config'])}
  old = {k: v for k, v in old.items() if not (k in REMOVED_KEYS and v == REMOVED_KEYS[k])}
  new = checks.flatten(json.loads(config.to_json_best_effort()))
  differing = sorted(
      k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in RESUMABLE_KEYS)
  members = [k for k in differing if k in POPULATION_KEYS]
  if members:
    shown = '; '.join(
        f'{k}: {old.get(k, "(absent)")!r} -> {new.get(k, "(absent)")!r}' for k in members)
    raise WorkdirError(f'--workdir={workdir} holds a run of other population members ({shown}); '
                       'its checkpoint cannot become another population. Use another --workdir.')
  adapters = [k for k in differing if k in ADAPTER_KEYS]
  if adapters:
    shown = '; '.join(f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in adapters)
    raise WorkdirError(f'--workdir={workdir} holds a checkpoint of other LoRA adapters ({shown}): '
                       'it cannot be resumed at another rank or targets (lora.rank 0 is full '
                       'fine-tuning). Use another --workdir.')
  if differing and not allow_changes:
    shown = '; '.join(
        f'{k}: {old.get(k, "(absent)")!r} -> {new.get(k, "(absent)")!r}' for k in differing[:8])
    more = f' (+{len(differing) - 8} more)' if len(differing) > 8 else ''
    raise WorkdirError(
        f'--workdir={workdir} holds a run of another config ({shown}{more}). Resuming would '
        'mix the two runs. Use another --workdir, or pass --allow_config_change to resume it '
        'with the new settings anyway.')
  return stored.get(SCHEDULE_KEY, config.num_steps)


def record_config(workdir, config, schedule_steps):
  """Writes the run's config.json (once the run has been set up: a refused run changes
  nothing)."""
  _write(os.path.join(workdir, CONFIG_FILE), {
      'config': json.loads(config.to_json_best_effort()),
      SCHEDULE_KEY: schedule_steps
  })


def _write(path, obj):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def claim(workdir, config, *, allow_changes=False, take_lock=True):
  """Checks the workdir is writable, locks it and checks the config against the run it holds;
  returns (the lock, the num_steps of the learning-rate schedule). A population member's
  directory is refused: its population's trainer writes it. ``take_lock=False`` (the other processes
  of a multi-process run) checks without locking: the lock is None."""
  member_file = os.path.join(workdir, MEMBER_FILE)
  if os.path.exists(member_file):
    owner = files.read_json(member_file, keys=('population_workdir',),
                            expected='a population member\'s marker')['population_workdir']
    raise WorkdirError(f'--workdir={workdir} is a member of the population in {owner}: resume '
                       'that population (same command, --workdir of the population) instead')
  check_writable(workdir)
  held = lock(workdir) if take_lock else None
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  has_checkpoint = os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))
  schedule_steps = check_identity(workdir, config, allow_changes=allow_changes,
                                  has_checkpoint=has_checkpoint)
  if schedule_steps != config.num_steps:
    print(
        f'num_steps changed from {schedule_steps} to {config.num_steps}: the learning-rate '
        f'schedule keeps its original length ({schedule_steps} steps)', file=sys.stderr)
  return held, schedule_steps
