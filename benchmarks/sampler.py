"""Sampler and log-prob throughput/memory for jtc, printed side by side in one run.

Run (full sizes: ~26M-parameter `small_25m`, batch 32, prompt 64, 256 new tokens):
  python -m benchmarks.sampler
Quick check:
  python -m benchmarks.sampler --small

Reports:
1. Generated tokens/s of `jtc.sampler.sample` (one prefill + KV-cache while_loop decode)
   against a naive sampler that re-runs the full forward over the whole [B, P + T] window
   for every new token (static shapes, so every step costs the same: `--naive_steps` steps
   are timed and the total is extrapolated to T steps). Target >= 10x.
2. The same against Hugging Face `transformers` greedy `generate()` on the same weights
   (`benchmarks/hf_baseline.py`, torch CPU). Target >= 2x.
3. Decode-step time against its memory-bandwidth floor (parameters + KV cache read once per
   step, at the copy bandwidth measured here) and prefill time against the matmul peak
   measured here (FLOPs / time / peak).
4. Peak memory (compiled `memory_analysis()`, nothing executed) of the chunked
   `jtc.model.token_logprobs` vs naive full logits, V = 151,936, B * T = 16,384, D = 256,
   for the forward and for forward+backward.
Timings are wall-clock medians of `--repeats` runs after a compile/warm-up call; the two
machine peaks are best-of-10 (on a shared machine other jobs only ever slow a run down).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jtc import model as model_lib
from jtc import sampler as sampler_lib

EOS = 0


def _times(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def median_time(fn, repeats):
  return statistics.median(_times(fn, repeats))


def copy_bandwidth_bytes_per_s(n_bytes=1 << 28, repeats=10):
  """Best bytes moved (read + write) per second by a jitted elementwise op on a big array.

  Best-of rather than median: a peak is what the machine can do when nothing else runs.
  """
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda x: x * 1.0001)
  jax.block_until_ready(f(x))
  return 2 * n_bytes / min(_times(lambda: f(x), repeats))


def matmul_flops_per_s(n=2048, repeats=10, dtype=jnp.float32):
  """Best FLOP/s of a jitted [n, n] @ [n, n] matmul."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a: a @ a)
  jax.block_until_ready(f(a))
  return 2 * n ** 3 / min(_times(lambda: f(a), repeats))


def naive_step_fn(config, P, T):
  """One token of naive sampling: full forward over the [B, P + T] buffer, no cache."""
  @jax.jit
  def step(params, tokens_BL, mask_BL, t):
    logits = model_lib.forward(params, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                               mask_BL).logits_BLV
    next_B = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, P + t - 1, axis=1, keepdims=False),
                        axis=-1).astype(jnp.int32)
    tokens_BL = jax.lax.dynamic_update_slice(tokens_BL, next_B[:, None], (0, P + t))
    mask_BL = jax.lax.dynamic_update_slice(mask_BL, jnp.ones_like(next_B)[:, None], (0, P + t))
    return tokens_BL, mask_BL
  return step


def attention_flops(config, B, L, S):
  """2 * (QK^T + PV) multiply-adds for L queries over S slots, all layers."""
  return 4 * B * L * S * config.n_heads * config.head_dim * config.n_layers


def logprob_memory(B, T, D, V, chunk):
  """Compiled memory (bytes) of chunked vs naive token log-probs, fwd and fwd+bwd."""
  hidden = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  head = jax.ShapeDtypeStruct((D, V), jnp.float32)
  targets = jax.ShapeDtypeStruct((B, T), jnp.int32)

  def naive(h, w, t):
    logp = jax.nn.log_softmax(jnp.einsum('BTD,DV->BTV', h, w), axis=-1)
    tgt = jnp.take_along_axis(logp, t[..., None], axis=-1)[..., 0]
    return tgt, -jnp.sum(jnp.exp(logp) * logp, axis=-1)

  chunked = functools.partial(model_lib.token_logprobs, vocab_chunk=chunk)

  def loss(fn):
    def f(h, w, t):
      logps, ent = fn(h, w, t)
      return -jnp.mean(logps) - 0.01 * jnp.mean(ent)
    return jax.grad(f, argnums=(0, 1))

  out = {}
  for name, fn in (('chunked', chunked), ('naive', naive)):
    for mode, g in (('fwd', fn), ('fwd+bwd', loss(fn))):
      stats = jax.jit(g).lower(hidden, head, targets).compile().memory_analysis()
      total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
               + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
      out[name, mode] = (total, stats.temp_size_in_bytes)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='tiny sizes for a quick check')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--naive_steps', type=int, default=2,
                      help='naive full-recompute steps timed (extrapolated to T)')
  parser.add_argument('--skip_hf', action='store_true')
  parser.add_argument('--skip_memory', action='store_true')
  args = parser.parse_args()

  if args.small:
    config = model_lib.ModelConfig.tiny(vocab_size=512)
    B, P, T = 4, 16, 32
  else:
    config = model_lib.ModelConfig.small_25m()
    B, P, T = 32, 64, 256
  params = model_lib.init_params(config, jax.random.key(0))
  # EOS never wins the argmax (zero tied embedding row -> logit 0), so every row generates T.
  params['embed']['embedding'] = params['embed']['embedding'].at[EOS].set(0.0)
  n_params = model_lib.num_params(params)
  prompt_BP = jnp.asarray(np.random.default_rng(0).integers(1, config.vocab_size, (B, P)),
                          jnp.int32)
  mask_BP = jnp.ones_like(prompt_BP)
  print(f'# jtc sampler benchmark: {n_params / 1e6:.1f}M params, B={B} P={P} T={T}, '
        f'{config.dtype}, devices={jax.devices()}')

  # --- Machine peaks, measured in this run.
  bandwidth = copy_bandwidth_bytes_per_s()
  peak_flops = matmul_flops_per_s()
  print(f'copy bandwidth           {bandwidth / 1e9:8.2f} GB/s (read+write, 256 MiB f32, best of 10)')
  print(f'matmul peak              {peak_flops / 1e9:8.2f} GFLOP/s (2048^3 f32, best of 10)')

  # --- KV-cache sampler.
  run = lambda: sampler_lib.sample(params, config, prompt_BP, mask_BP, rng=jax.random.key(1),
                                   num_samples=1, max_new_tokens=T, eos_id=EOS, pad_id=EOS,
                                   greedy=True)
  start = time.perf_counter()
  out = jax.block_until_ready(run())
  compile_s = time.perf_counter() - start
  assert int(out.completion_mask.sum()) == B * T, 'a row stopped early; timing is off'
  sample_s = median_time(run, args.repeats)
  kv_tps = B * T / sample_s

  # Prefill alone (same computation as the sampler's first phase).
  @jax.jit
  def prefill(params, tokens, mask):
    cache = model_lib.init_cache(config, B, P + T)
    hidden, cache = model_lib.hidden_states(params, config, tokens,
                                            model_lib.positions_from_mask(mask), mask, cache)
    return hidden[:, -1], cache
  jax.block_until_ready(prefill(params, prompt_BP, mask_BP))
  prefill_s = median_time(lambda: prefill(params, prompt_BP, mask_BP), args.repeats)
  decode_step_s = (sample_s - prefill_s) / (T - 1)

  # --- Naive full recompute.
  step = naive_step_fn(config, P, T)
  tokens = jnp.concatenate([prompt_BP, jnp.zeros((B, T), jnp.int32)], 1)
  mask = jnp.concatenate([mask_BP, jnp.zeros((B, T), jnp.int32)], 1)
  jax.block_until_ready(step(params, tokens, mask, 0))
  n_naive = T if args.small else min(args.naive_steps, T)
  start = time.perf_counter()
  state = (tokens, mask)
  for t in range(n_naive):
    state = step(params, *state, t)
  jax.block_until_ready(state)
  naive_s = (time.perf_counter() - start) / n_naive * T
  naive_tps = B * T / naive_s

  # --- Hugging Face generate() on the same weights.
  hf_tps = None
  if not args.skip_hf:
    try:  # benchmarks/hf_baseline.py (torch + transformers); None if they are missing.
      from benchmarks import hf_baseline  # pylint: disable=g-import-not-at-top
      hf_tps = hf_baseline.hf_generate_tokens_per_s(config, params, np.asarray(prompt_BP), T)
    except ImportError as e:
      print(f'(HF baseline unavailable: {e})')

  # --- Roofline fractions.
  S = P + T
  param_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
  cache_bytes = 2 * B * S * config.n_kv_heads * config.head_dim * config.n_layers * (
      jnp.dtype(config.jnp_dtype).itemsize)
  floor_s = (param_bytes + cache_bytes) / bandwidth
  non_embed = n_params - config.vocab_size * config.d_model
  prefill_flops = 2 * non_embed * B * P + attention_flops(config, B, P, S) + (
      2 * B * config.d_model * config.vocab_size)

  print()
  print(f'{"":28s}{"tokens/s":>12s}{"seconds":>10s}{"ratio":>10s}')
  print(f'{"jtc KV-cache sampler":28s}{kv_tps:12.1f}{sample_s:10.2f}{1.0:10.2f}'
        f'   (compile+first run {compile_s:.1f}s)')
  print(f'{"naive full recompute":28s}{naive_tps:12.1f}{naive_s:10.2f}{kv_tps / naive_tps:10.2f}'
        f'x  (KV/naive; {n_naive} of {T} steps timed, extrapolated)')
  if hf_tps is not None:
    print(f'{"HF transformers generate":28s}{hf_tps:12.1f}{B * T / hf_tps:10.2f}'
          f'{kv_tps / hf_tps:10.2f}x  (KV/HF, greedy, torch CPU)')
  else:
    print(f'{"HF transformers generate":28s}{"n/a":>12s}   (benchmarks/hf_baseline.py or '
          'torch/transformers not importable)')
  print()
  print(f'prefill                  {prefill_s * 1e3:8.1f} ms  {prefill_flops / 1e9:8.1f} GFLOP -> '
        f'{prefill_flops / prefill_s / 1e9:7.1f} GFLOP/s = '
        f'{prefill_flops / prefill_s / peak_flops:6.1%} of matmul peak')
  print(f'decode step              {decode_step_s * 1e3:8.2f} ms  floor {floor_s * 1e3:6.2f} ms '
        f'(params {param_bytes / 1e6:.0f} MB + KV cache {cache_bytes / 1e6:.0f} MB) -> '
        f'{floor_s / decode_step_s:6.1%} of bandwidth floor')

  if not args.skip_memory:
    Bm, Tm, Dm, Vm = 16, 1024, 256, 151_936
    mem = logprob_memory(Bm, Tm, Dm, Vm, chunk=8192)
    print()
    print(f'token_logprobs memory, V={Vm:,} B*T={Bm * Tm:,} D={Dm} f32 '
          '(compiled arguments+outputs+temps / temps only):')
    for mode in ('fwd', 'fwd+bwd'):
      (cp, ct), (nps, nt) = mem['chunked', mode], mem['naive', mode]
      print(f'  {mode:8s} chunked(8192) {cp / 2**30:7.2f} GiB / {ct / 2**30:6.2f}   '
            f'naive {nps / 2**30:7.2f} GiB / {nt / 2**30:6.2f}   ratio {nps / cp:6.1f}x')


if __name__ == '__main__':
  main()
