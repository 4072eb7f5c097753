"""What this machine does, measured: the median time of a jitted call, the best read bandwidth
and matmul FLOP/s (the roofline floors and MFU of the benchmarks divide by these)."""
import statistics
import time

import jax
import jax.numpy as jnp


def _times(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def median_time(fn, repeats):
  """Median seconds of ``fn()`` (blocked on its result) over ``repeats`` calls."""
  return statistics.median(_times(fn, repeats))


def read_bandwidth_bytes_per_s(n_bytes=1 << 28, repeats=10):
  """Best bytes read per second by a jitted reduction over a big array.

  A decode step reads weights and cache and writes little, so the floor is set by reading. (A
  copy also allocates and writes its output: on CPU it measured 5-7x lower, and the old sampler
  ran at 121% of a "floor" computed from it.) Best-of rather than median: a peak is what the
  machine can do when nothing else runs.
  """
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  jax.block_until_ready(f(x))
  return n_bytes / min(_times(lambda: f(x), repeats))


def matmul_flops_per_s(n=2048, repeats=10, dtype=jnp.float32):
  """Best FLOP/s of a jitted [n, n] @ [n, n] matmul."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a: a @ a)
  jax.block_until_ready(f(a))
  return 2 * n**3 / min(_times(lambda: f(a), repeats))
