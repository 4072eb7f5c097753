r"""Machine time of a seed population (one program) against the same runs as single processes.

  python -m benchmarks.population                  # 8 seeds x 80 steps, table1's GSPO at lr 1e-4
  python -m benchmarks.population --members 16 --jobs 8 --rounds 2   # a GPU (docs/populations.md)
  python -m benchmarks.population --lora-rank 4    # LoRA members on one base (docs/lora.md)

The workload is table1's GSPO configuration (experiments/sweeps.py: lr 1e-4, evaluation at step
0 and at the end, diagnostics every 5 steps), seeds 0 .. N-1, trained two ways, interleaved and
repeated ``--rounds`` times (the order alternates between rounds):
  population  one `python -m jtc.train` with --config.population.size=N;
  processes   N `python -m jtc.train` processes, ``--jobs`` at a time (experiments.run
              --no-population).
With ``--lora-rank r`` both are LoRA runs of rank r (`jtc.models.lora`: the members share one
frozen base) and a third workload runs beside them:
  full        the population of full-parameter members (rank 0), as without the flag.
Each figure is the wall time of the whole workload with the peak resident memory of its largest
process (a process at a time: ``--jobs`` of the single runs are resident together), the CPU
seconds its processes used
(user + system, from the kernel's accounting of the children) and the 1-minute load average
before and after; a round during which other processes kept more than 0.25 cores busy is marked
LOADED and its ratio is not to be reported. The time split sums the trainer's own phase timers
over the steps of every member (a population's members share one program, so its phases are
counted once): sample / score / update / eval, and the rest (start-up, compilation,
checkpoints) as wall minus their sum.

The final held-out accuracy of each population member and of the single run of its seed are
printed side by side (the members equal those runs at step 1 exactly; later they diverge by
float rounding like any two runs, so this compares distributions, paired by seed).
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ('sample', 'score', 'update', 'eval')
STEPS = 80
CONFIG = [
    '--config=configs/gspo.py', '--config.optim.learning_rate=0.0001', '--config.eval.every={n}',
    '--config.log.diagnostics_every=5', '--config.num_steps={n}'
]


def _flags(steps, lora_rank=0):
  return [f.format(n=steps) for f in CONFIG] + [f'--config.lora.rank={lora_rank}'] * (lora_rank > 0)


def _children_cpu():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _run(cmd, log):
  """Runs ``cmd``; the peak resident memory of its process in bytes (the kernel's accounting of
  that one child, `os.wait4`)."""
  with open(log, 'w') as err:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    raise subprocess.CalledProcessError(proc.returncode, cmd)
  return usage.ru_maxrss * 1024  # Linux reports kilobytes


def population(root, members, steps, lora_rank=0):
  """(member dirs, peak RSS) of one population of ``members`` seeds."""
  workdir = os.path.join(root, 'population')
  cmd = [sys.executable, '-m', 'jtc.train', f'--workdir={workdir}'] + _flags(
      steps, lora_rank) + ['--config.seed=0', f'--config.population.size={members}']
  rss = _run(cmd, os.path.join(root, 'population.log'))
  return [os.path.join(workdir, 'members', f'seed{s}') for s in range(members)], rss


def processes(root, members, steps, jobs, lora_rank=0):
  """(run dirs, the largest peak RSS of one process) of ``members`` single runs."""
  dirs = [os.path.join(root, f'seed{s}') for s in range(members)]

  def one(seed):
    cmd = [sys.executable, '-m', 'jtc.train', f'--workdir={dirs[seed]}'] + _flags(
        steps, lora_rank) + [f'--config.seed={seed}']
    return _run(cmd, dirs[seed] + '.log')

  with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    rss = max(pool.map(one, range(members)))
  return dirs, rss


def phase_seconds(dirs, shared):
  """Summed phase timers of the runs in ``dirs`` (of one of them when they share a program)."""
  out = dict.fromkeys(PHASES, 0.0)
  for d in dirs[:1] if shared else dirs:
    with open(os.path.join(d, 'metrics.jsonl')) as f:
      for line in f:
        record = json.loads(line)
        for p in PHASES:
          out[p] += record.get(f'time_{p}', 0.0)
  return out


def final_accuracy(d):
  with open(os.path.join(d, 'metrics.jsonl')) as f:
    last = [json.loads(line) for line in f][-1]
  return next(v for k, v in last.items() if k.startswith('eval/avg@'))


def measure(name, fn, root):
  """Runs ``fn(root)`` in a fresh directory; (dirs, figures)."""
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  load0, cpu0 = harness.load_average(), _children_cpu()
  with harness.OtherLoad() as other:
    dirs, rss = fn(root)
  cpu = _children_cpu() - cpu0
  shared = name != 'processes'  # one program
  phases = phase_seconds(dirs, shared=shared)
  rest = other.seconds - sum(phases.values()) if shared else float('nan')
  return dirs, dict(wall=other.seconds, cpu=cpu, load0=load0, phases=phases, rest=rest, other=other,
                    rss=rss)


def _line(name, m):
  split = ' / '.join(f'{p} {m["phases"][p]:.0f}' for p in PHASES)
  rest = '' if np.isnan(m['rest']) else f' / rest {m["rest"]:.0f}'
  # OtherLoad counts this benchmark's children as other processes: subtract their CPU use.
  others = max(0.0, m['other'].cores - m['cpu'] / m['wall'])
  loaded = '  LOADED' if others > harness.MAX_OTHER_CORES else ''
  return (f'{name:10s} wall {m["wall"]:7.1f} s  peak RSS {m["rss"] / 2**20:7.0f} MiB  cpu '
          f'{m["cpu"]:7.1f} s  (load {m["load0"]:.1f} -> {m["other"].load:.1f}, others '
          f'{others:.2f} cores)  phases: {split}{rest} (summed over '
          f'{"the processes" if name == "processes" else "one program"}){loaded}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--members', type=int, default=8)
  parser.add_argument('--steps', type=int, default=STEPS)
  parser.add_argument('--jobs', type=int, default=2, help='single processes at once')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument(
      '--lora-rank', type=int, default=0,
      help='LoRA rank of the population and the processes (0: full fine-tuning); '
      '> 0 adds the full-parameter population beside them')
  parser.add_argument('--workroot', default=os.path.join(tempfile.gettempdir(), 'jtc_bench_pop'))
  args = parser.parse_args()
  if args.lora_rank < 0:
    parser.error(f'--lora-rank={args.lora_rank} must be >= 0')
  print(harness.device_line())
  lora = f', LoRA rank {args.lora_rank} (and full-parameter members)' if args.lora_rank else ''
  print(f'{args.members} seeds x {args.steps} steps of table1 GSPO (lr 1e-4){lora}; processes at '
        f'--jobs {args.jobs}; {args.rounds} interleaved rounds')
  fns = {
      'population':
          lambda root: population(root, args.members, args.steps, args.lora_rank),
      'processes':
          lambda root: processes(root, args.members, args.steps, args.jobs, args.lora_rank),
      'full':
          lambda root: population(root, args.members, args.steps),
  }
  names = ['population', 'processes'] + ['full'] * (args.lora_rank > 0)
  ratios = []
  for r in range(args.rounds):
    order = names if r % 2 == 0 else names[::-1]
    got = {}
    for name in order:
      dirs, got[name] = measure(name, fns[name], os.path.join(args.workroot, name))
      got[name]['acc'] = [final_accuracy(d) for d in dirs]
      print(f'round {r + 1}: ' + _line(name, got[name]), flush=True)
    ratio = got['processes']['wall'] / got['population']['wall']
    cpu_ratio = got['processes']['cpu'] / got['population']['cpu']
    ratios.append((ratio, cpu_ratio))
    print(f'round {r + 1}: processes / population: wall {ratio:.2f}x, cpu {cpu_ratio:.2f}x')
    if 'full' in got:
      print(f'round {r + 1}: full-parameter / LoRA population: wall '
            f'{got["full"]["wall"] / got["population"]["wall"]:.2f}x, peak RSS '
            f'{got["full"]["rss"] / got["population"]["rss"]:.2f}x')
  print('final held-out accuracy by seed (population member / single process, last round):')
  a, b = np.array(got['population']['acc']), np.array(got['processes']['acc'])
  for s, (x, y) in enumerate(zip(a, b)):
    print(f'  seed {s}: {100 * x:.1f} / {100 * y:.1f}')
  print(f'  mean {100 * a.mean():.1f} / {100 * b.mean():.1f}; paired difference '
        f'{100 * (a - b).mean():+.1f} points (sd {100 * (a - b).std(ddof=1):.1f})')
  print('ratios (wall, cpu) by round: ' + ', '.join(f'{w:.2f}x / {c:.2f}x' for w, c in ratios))


if __name__ == '__main__':
  main()
