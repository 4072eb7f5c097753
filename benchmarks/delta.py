"""Cost of DelTA token coefficients (jtc.objectives.delta) relative to one loss+grad step.

Run (defaults: small_25m model, B=32, T=1024; memory table up to B*T=262,144 at D=4,096):
  python -m benchmarks.delta
Quick check:
  python -m benchmarks.delta --small
Actually run the estimator at the full size (needs ~4.1 GiB: float32 hidden states + temps):
  python -m benchmarks.delta --small --run_full

Three parts:
1. Time of `token_coefficients` (default options, K = 1) against one jitted
   forward+backward of a masked mean of -log p over the same batch with `jtc.models.model`
   (`sequence_logprobs`, the pass whose hidden states DelTA reuses). Target <= 5%
   (paper: ~10% of a step, spent on K + 2 extra forward passes we do not need).
2. Peak memory of the chunked estimator vs one chunk covering all tokens (unchunked), from
   the compiled executable's `memory_analysis()` (compile only: no arrays are allocated),
   for several B*T at D = 4,096 including 262,144.
3. With --run_full: the estimator on B*T = 262,144, D = 4,096 hidden states, timed,
   with the process peak RSS.
Note: on XLA:CPU a bfloat16 hidden-state operand is upcast to float32 once before the chunk
loop (a full copy; try --mem_dtype bfloat16), so the CPU numbers use float32 hidden states.
Timings interleave the two functions over rounds and report the median.
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jtc.objectives import delta


def _median_times(fns, rounds):
  times = {name: [] for name in fns}
  for _ in range(rounds):
    for name, (fn, args) in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def relative_time(args):
  from jtc.models import model  # the model helper's module; the estimator itself does not need it
  from jtc.models import logprobs
  config = getattr(model.ModelConfig, args.model)()
  params = model.init_params(config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  b, p_len, t_len = args.batch, args.prompt_len, args.length
  tokens = jnp.asarray(rng.integers(0, config.vocab_size, (b, p_len + t_len)), jnp.int32)
  lengths = rng.integers(t_len // 4, t_len + 1, b)
  mask_BT = jnp.asarray(np.arange(t_len)[None] < lengths[:, None], jnp.float32)
  input_mask = jnp.concatenate([jnp.ones((b, p_len), jnp.float32), mask_BT], axis=1)
  adv_B = jnp.asarray(rng.normal(size=b), jnp.float32)

  def loss(params):
    out = logprobs.sequence_logprobs(params, config, tokens, input_mask, completion_start=p_len)
    return -jnp.sum(out['logps'] * mask_BT) / jnp.sum(mask_BT)

  step = jax.jit(jax.value_and_grad(loss))
  fwd = jax.jit(lambda params: logprobs.sequence_logprobs(
      params, config, tokens, input_mask, completion_start=p_len, return_hidden=True))
  out = fwd(params)
  hidden_BTD, logps_BT = out['hidden'], out['logps']
  coeffs = jax.jit(lambda h, lp, a, m: delta.token_coefficients(
      h, lp, a, m, delta.DeltaOptions(chunk_size=args.chunk_size)))
  fns = {
      'loss+grad step': (step, (params,)),
      'delta lambda': (coeffs, (hidden_BTD, logps_BT, adv_B, mask_BT))
  }
  for fn, fargs in fns.values():  # compile
    jax.block_until_ready(fn(*fargs))
  med = _median_times(fns, args.rounds)
  print(f'model={args.model} D={config.d_model} params={model.num_params(params) / 1e6:.1f}M '
        f'B={b} P={p_len} T={t_len} tokens={b * t_len} chunk={args.chunk_size}')
  for name, t in med.items():
    print(f'  {name:16s} {t * 1e3:9.2f} ms')
  ratio = med['delta lambda'] / med['loss+grad step']
  print(f'  delta / step = {100 * ratio:.2f}%  (target <= 5%)')


def _compiled_memory(n_tokens, dim, length, chunk, dtype):
  b = n_tokens // length
  shapes = (jax.ShapeDtypeStruct(
      (b, length, dim), dtype), jax.ShapeDtypeStruct(
          (b, length), jnp.float32), jax.ShapeDtypeStruct(
              (b,), jnp.float32), jax.ShapeDtypeStruct((b, length), jnp.float32))
  fn = jax.jit(lambda h, lp, a, m: delta.token_coefficients(h, lp, a, m,
                                                            delta.DeltaOptions(chunk_size=chunk)))
  mem = fn.lower(*shapes).compile().memory_analysis()
  return mem.argument_size_in_bytes, mem.temp_size_in_bytes, mem.output_size_in_bytes


def memory_table(args):
  gib = 2.0**30
  print(f'compiled memory (memory_analysis), D={args.mem_dim}, hidden {args.mem_dtype}, '
        f'T={args.mem_length}; one chunk of v = chunk*D*4 bytes')
  print(f'  {"B*T":>8s} {"chunk":>8s} {"args GiB":>9s} {"temp GiB":>9s} {"out GiB":>8s}')
  for n in args.mem_tokens:
    for chunk in (args.chunk_size, n):
      a, t, o = _compiled_memory(n, args.mem_dim, args.mem_length, chunk, args.mem_dtype)
      label = f'{chunk}' if chunk != n else 'all'
      print(f'  {n:8d} {label:>8s} {a / gib:9.3f} {t / gib:9.3f} {o / gib:8.4f}')


def run_full(args):
  n, dim, length = 262_144, args.mem_dim, args.mem_length
  b = n // length
  key = jax.random.PRNGKey(0)
  # Pseudo-random hidden states built elementwise inside jit (jax.random.normal would hold
  # several full-size temporaries and dominate the peak RSS).
  hidden = jax.jit(lambda: jnp.sin(
      jax.lax.iota(jnp.float32, n * dim).reshape(b, length, dim) * 0.7548776662 + jax.lax.iota(
          jnp.float32, n * dim).reshape(b, length, dim)**0.5).astype(args.mem_dtype))()
  logps = jnp.log(jax.random.uniform(jax.random.fold_in(key, 1), (b, length)))
  adv = jax.random.normal(jax.random.fold_in(key, 2), (b,))
  mask = jnp.ones((b, length), jnp.float32)
  fn = jax.jit(lambda h, lp, a, m: delta.token_coefficients(
      h, lp, a, m, delta.DeltaOptions(chunk_size=args.chunk_size)))
  fn = fn.lower(hidden, logps, adv, mask).compile()
  jax.block_until_ready(hidden)
  rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  t0 = time.perf_counter()
  lam, met = jax.block_until_ready(fn(hidden, logps, adv, mask))
  t1 = time.perf_counter()
  jax.block_until_ready(fn(hidden, logps, adv, mask))
  t2 = time.perf_counter()
  rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  print(f'full size B*T={n} D={dim} {args.mem_dtype}: first call {t1 - t0:.2f} s, '
        f'second {t2 - t1:.2f} s; peak RSS {rss0:.2f} -> {rss1:.2f} GiB '
        f'(hidden alone {hidden.nbytes / 2 ** 30:.2f} GiB); '
        f'finite={bool(jnp.all(jnp.isfinite(lam)))} mean={float(jnp.mean(lam)):.4f}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true',
                      help='tiny model, B=16, T=256; memory table at 16k/65k/262k tokens')
  parser.add_argument('--model', default='small_25m', choices=['tiny', 'small_25m'])
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--prompt_len', type=int, default=64)
  parser.add_argument('--length', type=int, default=1024)
  parser.add_argument('--chunk_size', type=int, default=4096)
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--mem_dim', type=int, default=4096)
  parser.add_argument('--mem_length', type=int, default=1024)
  parser.add_argument('--mem_dtype', default='float32', choices=['bfloat16', 'float32'])
  parser.add_argument('--mem_tokens', type=int, nargs='+', default=[16_384, 65_536, 262_144])
  parser.add_argument('--run_full', action='store_true',
                      help='also run the estimator at B*T=262,144, D=4,096')
  parser.add_argument('--skip_step', action='store_true', help='skip part 1')
  harness.add_cpu_flag(parser)
  args = parser.parse_args()
  print(f'# {harness.device_line()}')
  if args.small:
    args.model, args.batch, args.prompt_len, args.length, args.rounds = 'tiny', 16, 32, 256, 5
  if not args.skip_step:
    relative_time(args)
  memory_table(args)
  if args.run_full:
    run_full(args)


if __name__ == '__main__':
  main()
