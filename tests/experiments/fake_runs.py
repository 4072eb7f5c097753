"""A fake trainer (a few lines of Python writing a `metrics.jsonl`), fake sweeps and summaries:
the runner and the tables are exercised without a model."""
import sys

from experiments import schedule
from experiments import sweeps as sweeps_lib

# Writes metrics.jsonl for steps 0..N like jtc.train would, resuming after the last step found;
# accuracy is higher for 'better' runs; a run named 'broken' fails; every launch is counted.
FAKE_TRAINER = r'''
import json, os, sys
workdir, name, seed, n, counter, stop_at = sys.argv[1:7]
seed, n, stop_at = int(seed), int(n), int(stop_at)
with open(counter, 'a') as f:
  f.write(name + '\n')
if name == 'broken':
  sys.stderr.write('Traceback: something broke in ' + name + '\n')
  sys.exit(3)
path = os.path.join(workdir, 'metrics.jsonl')
done = []
if os.path.exists(path):
  done = [json.loads(l) for l in open(path)]
start = done[-1]['step'] + 1 if done else 0
bonus = 0.1 if name == 'better' else 0.0
with open(path, 'a') as f:
  for step in range(start, n + 1):
    if step > stop_at:
      sys.exit(0)
    r = 0.2 + 0.05 * step + bonus + 0.01 * seed
    rec = {'step': step, 'reward_mean': r, 'accuracy': r, 'entropy': 1.0 - 0.01 * step,
           'asym': 0.5 - bonus, 'compute/generated_tokens': 100 * step,
           'eval/avg@4': 0.3 + bonus + 0.01 * seed}
    f.write(json.dumps(rec) + '\n')
'''


def fake_sweep(names=('base', 'better'), num_steps=4):
  runs = tuple(sweeps_lib.Run(n, 'gspo', n.upper()) for n in names)
  tables = (sweeps_lib.Table('acc', 'final:eval/avg@', unit='(%)', scale=100.0,
                             expect=(('BETTER', '>'),)),
            sweeps_lib.Table('jitter', 'jitter2:reward_mean', higher_is_better=False),
            sweeps_lib.Table('compute', 'compute_at:reward_mean', normalize=True, threshold='auto'))
  return sweeps_lib.Sweep(name='fake', description='a fake sweep', runs=runs, baseline='BASE',
                          tables=tables, num_steps=num_steps, seeds=2)


def fake_command(tmp_path, stop_at=10**9):
  script = tmp_path / 'fake_trainer.py'
  script.write_text(FAKE_TRAINER)
  counter = tmp_path / 'launches.txt'

  def make(spec, workdir):
    return [
        sys.executable,
        str(script), workdir, spec.run.name,
        str(spec.seed),
        str(spec.num_steps),
        str(counter),
        str(stop_at)
    ]

  return make, counter


def launches(counter):
  return counter.read_text().split() if counter.exists() else []


def run_fake_sweep(tmp_path, sweep, make, seeds=2):
  return schedule.run_sweep(sweep, seeds=seeds, jobs=2, results_dir=str(tmp_path / 'res'),
                            workroot=str(tmp_path / 'work'), make_command=make, validate=False,
                            log=lambda *a: None)
