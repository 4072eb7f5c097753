"""The trunk's two attentions side by side on this machine: 'dense' (the [L, L] scores at once)
against 'blockwise' (an online softmax over key blocks, recomputing backward), at the default
config's shapes.

Run (the default config: the shipped ~0.8M-parameter base policy, P = 20, T = 32, the behaviour
pass's 16 prompts x G = 8 = 128 rows, float32; on a quiet machine):
  python -m benchmarks.attention --cpu
Quick check (8 rows, 2 rounds):
  python -m benchmarks.attention --cpu --small

Reports, measured in one run: the seconds of one jitted call of
  forward   `logprobs.sequence_logprobs` (the behaviour pass), and
  backward  its gradient with respect to the parameters (forward + backward, the update's core),
for each attention, `--rounds` times INTERLEAVED (dense, blockwise, dense, ...) after one
compile call each, with the 1-minute load average and the cores other processes kept busy
printed beside every figure (`harness.OtherLoad`). The ratio blockwise / dense of the medians is
printed only when no other process competed for the cores during any timed call; otherwise it
says "LOADED: not a valid ratio". At L = 52 blockwise runs one block (`attention.BLOCK` = 512
rows per block): the online softmax's bookkeeping on top of the same work as dense.
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import common as configs_common
from jtc.models import attention
from jtc.models import bundles
from jtc.models import logprobs
from jtc.models import model as model_lib

IMPLS = ('dense', 'blockwise')


def inputs(rows, P, T, vocab, seed=0):
  """[rows, P + T] tokens and a mask with left-padded prompts and pads after an EOS."""
  rng = np.random.default_rng(seed)
  mask = np.ones((rows, P + T), np.int32)
  mask[:, :P][np.arange(P)[None] < rng.integers(0, P // 2, size=rows)[:, None]] = 0
  mask[:, P:][np.arange(T)[None] >= rng.integers(1, T + 1, size=rows)[:, None]] = 0
  return jnp.asarray(rng.integers(0, vocab, size=(rows, P + T)), jnp.int32), jnp.asarray(mask)


def programs(config, params, tokens, mask, P):
  """{(impl, 'forward' | 'backward'): a compiled zero-argument call}."""
  out = {}
  for impl in IMPLS:
    c = dataclasses.replace(config, attention=impl)
    logps = lambda p, c=c: logprobs.sequence_logprobs(p, c, tokens, mask, completion_start=P)
    fwd = jax.jit(lambda p, f=logps: f(p)['logps'])
    bwd = jax.jit(jax.grad(lambda p, f=logps: jnp.sum(f(p)['logps'] * mask[:, P:])))
    for name, fn in (('forward', fwd), ('backward', bwd)):
      compiled = fn.lower(params).compile()
      out[impl, name] = lambda compiled=compiled: jax.block_until_ready(compiled(params))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--small', action='store_true', help='8 rows, 2 rounds: a quick check')
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()
  c = configs_common.get_config(None)
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  rows = 8 if args.small else c.rollout.prompts_per_step * c.rollout.sampling.num_samples
  rounds = 2 if args.small else args.rounds
  bundle = bundles.load_policy_bundle(c.policy.init)  # the shipped base policy
  config, params = bundle.model_config, bundle.params
  tokens, mask = inputs(rows, P, T, config.vocab_size)
  print(f'# {harness.device_line()}; {rows} rows x L = {P} + {T}, blocks of '
        f'{min(attention.BLOCK, P + T)}, {model_lib.num_params(params) / 1e6:.2f}M parameters, '
        f'{rounds} rounds interleaved')
  calls = programs(config, params, tokens, mask, P)
  seconds, loaded = harness.interleaved(
      calls, rounds,
      lambda r, key, other: f'round {r} {key[0]:9s} {key[1]:8s} {1e3 * other.seconds:8.2f} ms  '
      f'({harness.load_str(other)})')
  for name in ('forward', 'backward'):
    med = {impl: statistics.median(seconds[impl, name]) for impl in IMPLS}
    ratio = ('LOADED: not a valid ratio'
             if loaded else f"blockwise / dense = {med['blockwise'] / med['dense']:.2f}")
    print(f"{name}: median dense {1e3 * med['dense']:.2f} ms, blockwise "
          f"{1e3 * med['blockwise']:.2f} ms; {ratio}")
  print(f'# finished at {time.strftime("%H:%M:%S")}, load {harness.load_average():.1f}')


if __name__ == '__main__':
  main()
