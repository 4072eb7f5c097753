"""A dropless mixture-of-experts layer against a dense SwiGLU layer of the same active parameters,
side by side on this machine.

Run (the tiny MoE policy's layer: D = 128, X = 8 experts of F = 192, W = 2 per token, against a
dense MLP of width W * F = 384 -- the shipped dense policy's; the behaviour pass's 128 rows x
52 tokens; float32; on a quiet machine):
  python -m benchmarks.moe --cpu
A wider layer (D = 512, X = 16 experts of 256, W = 2; dense width 512):
  python -m benchmarks.moe --cpu --wide
Quick check (512 tokens, 2 rounds):
  python -m benchmarks.moe --cpu --small

Reports, measured in one run, tokens per second of one jitted call of
  forward   the layer's output (`jtc.models.moe.feed_forward` / `jtc.models.layers.mlp`), and
  backward  the gradient of a scalar of it with respect to the parameters and the input,
for the dense layer and each MoE implementation (`moe.MOE_IMPLS`), `--rounds` times
INTERLEAVED after one compile call each, with the load average and the cores other processes
kept busy beside every figure (`harness.OtherLoad`). The ratios MoE / dense of the medians are
printed only when no other process competed for the cores during any timed call; otherwise
they are marked "LOADED". The active parameters per token are equal by construction (W experts
of width F against one MLP of width W * F; the router's D * X more); the MoE layer does more
work around them: the router, the sort and gather of (token, expert) pairs ('ragged', whose
`ragged_dot` XLA:CPU lowers as a masked dense product over all X groups) or every expert on
every token ('dense', X / W times the matmul FLOPs).
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

from jtc.models import layers
from jtc.models import model as model_lib
from jtc.models import moe
from jtc.models.model_config import ModelConfig


def configs(wide: bool):
  """(MoE config, dense config of the same active MLP width)."""
  if wide:
    m = ModelConfig.tiny_moe(d_model=512, n_experts=16, d_expert=256, n_heads=8, head_dim=64)
  else:
    m = ModelConfig.tiny_moe()
  return m, dataclasses.replace(m, n_experts=0, d_ff=m.experts_per_token * m.d_expert)


def programs(moe_config, dense_config, tokens):
  """{(layer, 'forward' | 'backward'): a compiled zero-argument call} on one [1, U, D] input."""
  key = jax.random.key(0)
  x_BLD = jax.random.normal(key, (1, tokens, moe_config.d_model))
  layer = lambda c: jax.tree.map(lambda a: a[0], model_lib.init_params(c, key)['layers'])['mlp']
  variants = {'dense MLP': (dense_config, lambda p, x, c=dense_config: layers.mlp(p, x, c))}
  for impl in moe.MOE_IMPLS:
    c = dataclasses.replace(moe_config, moe_impl=impl)
    variants[f'MoE {impl}'] = (c, lambda p, x, c=c: moe.feed_forward(p, x, c)[0])
  out = {}
  for name, (c, fn) in variants.items():
    p = layer(c)
    fwd = jax.jit(fn)
    bwd = jax.jit(jax.grad(lambda p, x, fn=fn: jnp.sum(jnp.sin(fn(p, x))), argnums=(0, 1)))
    for kind, f in (('forward', fwd), ('backward', bwd)):
      compiled = f.lower(p, x_BLD).compile()
      out[name, kind] = lambda compiled=compiled, p=p: jax.block_until_ready(compiled(p, x_BLD))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--small', action='store_true', help='512 tokens, 2 rounds: a quick check')
  parser.add_argument('--wide', action='store_true', help='D = 512, 16 experts of 256')
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()
  moe_config, dense_config = configs(args.wide)
  tokens = 512 if args.small else 128 * 52
  rounds = 2 if args.small else args.rounds
  c = moe_config
  print(f'# {harness.device_line()}; {tokens} tokens, D = {c.d_model}, X = {c.n_experts} experts '
        f'of F = {c.d_expert}, W = {c.experts_per_token} per token vs a dense MLP of '
        f'{dense_config.d_ff}; {rounds} rounds interleaved')
  calls = programs(moe_config, dense_config, tokens)
  seconds, loaded = harness.interleaved(
      calls, rounds, lambda r, key, other:
      f'round {r} {key[0]:12s} {key[1]:8s} {tokens / other.seconds:12.0f} tokens/s  '
      f'({harness.load_str(other)})')
  for kind in ('forward', 'backward'):
    med = {name: statistics.median(seconds[name, k]) for name, k in calls if k == kind}
    base = med['dense MLP']
    parts = [f'{name} {tokens / s:.0f} tokens/s' for name, s in med.items()]
    ratios = [f'{name} / dense = {base / s:.2f}' for name, s in med.items() if name != 'dense MLP']
    print(f"{kind}: median {', '.join(parts)}; throughput "
          f"{'LOADED: not valid ratios' if loaded else ', '.join(ratios)}")
  print(f'# finished at {time.strftime("%H:%M:%S")}, load {harness.load_average():.1f}')


if __name__ == '__main__':
  main()
