"""Jitted loss + gradient time of every objective in jtc.objectives, relative to 'dapo'.

Run (full size, B=256, T=1024, G=16):
  python -m benchmarks.objectives
Quick check:
  python -m benchmarks.objectives --small

Target (issue 2): every DFPO variant and grpo_fix <= 1.10x dapo. The gradient is taken w.r.t.
the [B, T] log-probs (the objective's own cost, no model). Timings interleave the losses over
several rounds and report the median, so machine load affects every loss alike.
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jtc import objectives

CONFIGS = [(name, {}) for name in objectives.LOSSES] + [
    ('dfpo_pos_orth_proj', {
        'solver': 'truncate_rebalance'
    }),
    ('dfpo_min_replace', {
        'stop_gradient': False
    }),
]


def make_inputs(b, t, seed=0):
  rng = np.random.default_rng(seed)
  logps = rng.normal(-1.0, 0.5, (b, t)).astype(np.float32)
  old = (logps + rng.normal(0.0, 0.1, (b, t))).astype(np.float32)
  lengths = rng.integers(t // 4, t + 1, b)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  adv = rng.normal(size=b).astype(np.float32)
  tw = rng.uniform(0.8, 1.2, (b, t)).astype(np.float32)
  return [jnp.asarray(x) for x in (logps, old, adv, mask, tw)]


def build(name, hparams, group_size):

  def f(logps, old, adv, mask, tw):
    return objectives.compute_loss(name, logps=logps, old_logps=old, advantages=adv, mask=mask,
                                   group_size=group_size,
                                   token_weights=tw if name == 'delta' else None, **hparams)[0]

  return jax.jit(jax.value_and_grad(f))


def time_once(fn, args):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='B=32, T=128 quick run')
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--length', type=int, default=1024)
  parser.add_argument('--group_size', type=int, default=16)
  parser.add_argument('--rounds', type=int, default=30)
  parser.add_argument('--inner', type=int, default=5, help='calls per timing sample')
  harness.add_cpu_flag(parser)
  args = parser.parse_args()
  print(f'# {harness.device_line()}')
  b, t = (32, 128) if args.small else (args.batch, args.length)
  inputs = make_inputs(b, t)
  fns = {}
  for name, hp in CONFIGS:
    label = name + ''.join(f' {k}={v}' for k, v in hp.items())
    fns[label] = build(name, hp, args.group_size)
    jax.block_until_ready(fns[label](*inputs))  # compile
  samples = {label: [] for label in fns}
  for _ in range(args.rounds):
    for label, fn in fns.items():
      samples[label].append(sum(time_once(fn, inputs) for _ in range(args.inner)) / args.inner)
  base = statistics.median(samples['dapo'])
  print(f'jtc.objectives loss+grad, B={b} T={t} G={args.group_size}, '
        f'median of {args.rounds} rounds x {args.inner} calls ({jax.default_backend()})')
  print(f'{"objective":50s} {"ms":>8s} {"x dapo":>7s}')
  for label, ts in samples.items():
    med = statistics.median(ts)
    print(f'{label:50s} {1e3 * med:8.3f} {med / base:7.2f}')


if __name__ == '__main__':
  main()
