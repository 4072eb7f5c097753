"""The table of `benchmarks/device_check.sh`: one markdown row per measurement, from its output
directory (a part that failed or ran out of time says so instead of a number).

  python -m benchmarks.device_table OUT
"""

import argparse
import json
import os
import re
import sys


def _read(out, name):
  path = os.path.join(out, name)
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return f.read()


def exit_codes(out):
  """{part: exit status} from parts.txt ('NAME: exit RC after ...')."""
  text = _read(out, 'parts.txt') or ''
  return {m[1]: int(m[2]) for m in re.finditer(r'^(\S+): exit (\d+)', text, re.M)}


def _missing(rcs, part):
  """Why ``part`` has no number: not run, ran out of time or failed; None when it ran."""
  rc = rcs.get(part)
  if rc is None:
    return 'not run'
  if rc in (124, 137):
    return 'not measured (ran out of its time limit)'
  return None if rc == 0 else f'not measured (exit {rc}; {part}.txt)'


def sampler_rows(out, rcs):
  """Sampler tokens/s of each scheduler and their ratio."""
  why = _missing(rcs, 'rollout')
  data = json.loads(_read(out, 'rollout.json') or 'null') if why is None else None
  if not data:
    return [('sampler tokens/s, static vs continuous', why or 'no rollout.json', '')]
  (name, setup), = data['setups'].items()
  rates = setup['tokens_per_s']
  note = (f"{setup['label']}; lengths mean {setup['mean_length']:.0f}, p99 "
          f"{setup['p99_length']:.0f}; same tokens: {'yes' if setup['same_tokens'] else 'NO'}; "
          f"load {setup['load']:.1f}")
  rows = [(f'sampler tokens/s, {system} ({name})', f'{rate:.0f}', note)
          for system, rate in rates.items()]
  best = max((r for s, r in rates.items() if s != 'static'), default=None)
  if best is not None:
    rows.append(('sampler, best continuous / static', f"{best / rates['static']:.2f}x", ''))
  return rows


def update_rows(out, rcs):
  """The update step's tokens/s and MFU at the Qwen3-0.6B shape (train_step's MFU section)."""
  why = _missing(rcs, 'train_step')
  text = _read(out, 'train_step.txt') or ''
  shape = re.search(r'(\d+) sequences x (\d+) tokens', text)
  step = re.search(r'([\d.]+) ms/step \(median\)', text)
  mfu = re.search(r'MFU\s+([\d.]+)\s*%', text)
  if why or not (shape and step and mfu):
    return [('RL update tokens/s and MFU (Qwen3-0.6B shape)', why or 'not found in the output', '')]
  tokens = int(shape[1]) * int(shape[2])
  note = f'{shape[1]} sequences x {shape[2]} tokens, {float(step[1]):.0f} ms/step'
  return [('RL update tokens/s (Qwen3-0.6B shape)', f'{tokens / float(step[1]) * 1e3:.0f}', note),
          ('RL update MFU (Qwen3-0.6B shape)', f'{float(mfu[1]):.1f} %', '')]


def population_rows(out, rcs):
  """Seeds per hour of the population against one run."""
  text = _read(out, 'population_ms.txt') or ''
  runs = {int(n): int(ms) for n, ms in re.findall(r'^(\d+) (\d+)$', text, re.M)}
  rows, rates = [], {}
  for n, ms in sorted(runs.items()):
    why = _missing(rcs, f'population_{n}')
    rates[n] = n / (ms / 1000) * 3600 if why is None else None
    rows.append((f'seeds per hour, population N={n}', why or
                 f'{rates[n]:.0f}', f'{ms / 1000:.0f} s wall, configs/gspo.py'))
  if len(rates) == 2 and None not in rates.values():
    (_, one), (n, many) = sorted(rates.items())
    rows.append((f'seeds per hour, N={n} / N=1', f'{many / one:.2f}x', ''))
  return rows or [('seeds per hour, population', 'not run', '')]


def preflight_rows(out, rcs):
  """`jtc plan --gpu`'s predicted peak against the device's measured peak."""
  why = _missing(rcs, 'preflight')
  plan = _read(out, os.path.join('preflight', 'plan.txt')) or ''
  summary = json.loads(_read(out, os.path.join('preflight', 'summary.json')) or 'null')
  predicted = re.search(r'peaks at ([\d.]+) GiB', plan)
  peaks = [
      v for row in (summary or {}).get('steps', []) for k, v in row.items()
      if k.startswith('peak_after_') and v
  ]
  return [('jtc plan --gpu predicted peak per chip',
           f'{float(predicted[1]):.2f} GiB' if predicted else (why or 'not found in plan.txt'), ''),
          ('measured device peak (trainer, preflight run)',
           f'{max(peaks) / 2**30:.2f} GiB' if peaks else
           (why or 'not measured (the device reports no memory)'), '')]


def table(out):
  """The markdown table of ``out``."""
  rcs = exit_codes(out)
  rows = (sampler_rows(out, rcs) + update_rows(out, rcs) + population_rows(out, rcs) +
          preflight_rows(out, rcs))
  lines = ['| measurement | value | note |', '|---|---|---|']
  lines += [f'| {a} | {b} | {c} |' for a, b, c in rows]
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m benchmarks.device_table',
                                   description='The table of a device_check.sh run.')
  parser.add_argument('out', help="device_check.sh's folder")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if not os.path.isdir(args.out):
    parser.error(f'OUT={args.out!r} is not a folder (device_check.sh writes one)')
  print(table(args.out))


if __name__ == '__main__':
  main()
