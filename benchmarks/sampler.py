"""Sampler throughput against its roofline floor, today's design and Hugging Face, side by side.

Run (CPU config: ~26M-parameter `small_25m`, f32, B=32 prompts x G=1, P=64, T=256, greedy):
  python -m benchmarks.sampler [--cpu]
  python -m benchmarks.sampler --cpu --sampled --skip_naive --skip_memory   # temperature-1 draws, no HF
The GPU config of issue 16 (Qwen3-0.6B shape, bf16, 32 prompts x G=8, P=128, T=512, T=1 sampling):
  python -m benchmarks.sampler --qwen3-0.6b
Quick check: python -m benchmarks.sampler --small

Reports, measured in one run on whatever backend JAX finds (`--cpu` forces CPU):
1. Generated tokens/s of three systems, each run `--rounds` times INTERLEAVED (old jtc, new
   jtc, HF, old jtc, ...) after one compile/warm-up call each, with the 1-minute load average
   and the cores OTHER processes kept busy during that call (`harness.OtherLoad`: the host's CPU
   time from /proc/stat minus this process's) printed beside every figure; the 1-minute load
   average counts the benchmark's own threads, so on a quiet 2-core host it reads about 2. If
   other processes used more than `harness.MAX_OTHER_CORES` during any timed call, the ratios
   say "LOADED: not a valid ratio". The systems:
     old jtc  the sampler before this design (tests/models/reference_sampler.py, frozen): prompt
              cache repeated G times, the whole [P + T] cache of every row read every step,
              one unrolled Flax module per layer;
     new jtc  `jtc.models.sampler.sample`: the prompt's K/V once per prompt (shared by its G rows),
              the live prefix of each row's completion cache in blocks, stacked layers;
     HF       transformers `generate()` (greedy, torch CPU, same weights; CPU backend only).
   Ratios new/old and new/HF are of the medians.
2. The roofline floor of each design's decode: per step, the larger of (a) the seconds needed
   to read the parameters plus the KV cache that the design reads at that step, at the read
   bandwidth measured here (a jitted reduction over 256 MiB; 1 GiB on an accelerator), and (b)
   the seconds its FLOPs take at the matmul peak measured here (2 * R * the weights a token is
   multiplied through, plus attention over the slots read); summed over the T steps
   (tokens/s = generated tokens / that time). Bytes read per step:
     old: params + R * (P + T) slots * Y layers * K heads * H * 2 (k, v) * bytes;
     new: params + B * P prompt slots (once per prompt) + R * ceil((t + 1) / C) * C slots at
          step t (C = block size).
   Tokens/s as a fraction of the floor says how far each implementation is from its design;
   the share of compute-bound steps says which resource sets the floor (for the CPU config on
   the 2-core machine the two terms are close, and which is larger changed with the measured
   read bandwidth, 36-71 GB/s between quiet runs).
3. (CPU config) the naive sampler that re-runs the full forward over the [B, P + T] window
   for every new token, prefill time against the matmul peak, and the memory of the chunked
   `jtc.models.logprobs.token_logprobs` vs naive logits (compiled `memory_analysis()`), and one token
   choice from [R, V] logits (greedy and a temperature-1 draw, with the token's log-prob), the
   old sampler's against the new one's, jitted alone and interleaved.
Timings are wall clock; the machine peaks are best-of-10 (`benchmarks.machine`).
"""
from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import functools
import importlib.util
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine
from jtc.models import decode
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.models import sampler as sampler_lib

EOS = 0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_reference_sampler():
  """tests/models/reference_sampler.py (the frozen earlier sampler) as a module."""
  path = os.path.join(REPO, 'tests', 'models', 'reference_sampler.py')
  spec = importlib.util.spec_from_file_location('reference_sampler', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def decode_floor_seconds(config, n_param_bytes, *, B, G, P, T, block_size, bandwidth, peak_flops):
  """{'old': (seconds, compute-bound fraction), 'new': ...}: the roofline floor of T decode
  steps of each design (module docstring, item 2).

  A step takes at least the larger of (bytes it reads) / bandwidth and (its FLOPs) / matmul
  peak; the floor sums that over the T steps, and the fraction counts the steps where the
  FLOPs term is the larger."""
  R, c = B * G, config
  slot_bytes = 2 * c.n_layers * c.n_kv_heads * c.head_dim * jnp.dtype(c.jnp_dtype).itemsize
  C = min(block_size, T)
  matmul_flops = 2 * R * num_matmul_params(c)
  slot_flops = attention_flops(c, R, 1, 1)  # one query per row against one slot, all layers

  def floor(reads):  # reads: (bytes, cache slots attended) of every step
    steps = [(n_bytes / bandwidth, (matmul_flops + slot_flops * slots) / peak_flops)
             for n_bytes, slots in reads]
    return sum(max(s) for s in steps), sum(f > b for b, f in steps) / len(steps)

  live = [-(-(t + 1) // C) * C for t in range(T)]
  return {
      'old': floor([(n_param_bytes + R * (P + T) * slot_bytes, P + T)] * T),
      'new': floor([(n_param_bytes + (B * P + R * l) * slot_bytes, P + l) for l in live]),
  }


def num_matmul_params(config):
  """Weights a token is multiplied through: every layer's, plus the LM head (V x D, tied or
  not); the embedding lookup is a gather, not a matmul."""
  c = config
  attn = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
  return c.n_layers * (attn + 3 * c.d_model * c.d_ff) + c.vocab_size * c.d_model


def naive_step_fn(config, P):
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

  chunked = functools.partial(logprobs.token_logprobs, vocab_chunk=chunk)

  def loss(fn):

    def f(h, w, t):
      logps, ent = fn(h, w, t)
      return -jnp.mean(logps) - 0.01 * jnp.mean(ent)

    return jax.grad(f, argnums=(0, 1))

  out = {}
  for name, fn in (('chunked', chunked), ('naive', naive)):
    for mode, g in (('fwd', fn), ('fwd+bwd', loss(fn))):
      stats = jax.jit(g).lower(hidden, head, targets).compile().memory_analysis()
      total = (stats.argument_size_in_bytes + stats.output_size_in_bytes +
               stats.temp_size_in_bytes - stats.alias_size_in_bytes)
      out[name, mode] = (total, stats.temp_size_in_bytes)
  return out


def choice_seconds(old_choose, new_choose, R, V, sampling, rounds=5, calls=50):
  """{'greedy' | 'sampled': ({'old': s, 'new': s}, harness.OtherLoad)}: one token choice from
  [R, V] logits (token and its log-prob), each sampler's `_choose` jitted alone, interleaved,
  best of `rounds`, and the other processes' load during the timing."""
  logits_RV = jax.random.normal(jax.random.key(0), (R, V), jnp.float32)
  key = jax.random.key(1)
  out = {}
  for mode, greedy in (('greedy', True), ('sampled', False)):
    kw = dict(temperature=sampling.get('temperature', 1.0), top_k=0, top_p=1.0, min_p=0.0,
              greedy=greedy)
    fns = {
        n: jax.jit(functools.partial(c, **kw)) for n, c in (('old', old_choose), ('new', new_choose))
    }
    best = {n: float('inf') for n in fns}
    for fn in fns.values():
      jax.block_until_ready(fn(logits_RV, key))
    with harness.OtherLoad() as other:
      for _ in range(rounds):
        for n, fn in fns.items():
          start = time.perf_counter()
          for _ in range(calls):
            res = fn(logits_RV, key)
          jax.block_until_ready(res)
          best[n] = min(best[n], (time.perf_counter() - start) / calls)
    out[mode] = (best, other)
  return out


def setups(args):
  """(label, config, B prompts, G, P, T, sampling kwargs) of the chosen size."""
  if args.qwen3_0_6b:
    return ('Qwen3-0.6B shape, bf16', model_lib.ModelConfig.qwen3_0_6b(max_seq_len=4096), 32, 8,
            128, 512, dict(temperature=1.0))
  sampling = dict(temperature=1.0) if args.sampled else dict(greedy=True)
  if args.small:
    return ('tiny', model_lib.ModelConfig.tiny(vocab_size=512), 4, 2, 16, 32, sampling)
  return ('small_25m, f32', model_lib.ModelConfig.small_25m(), 32, 1, 64, 256, sampling)


def _parser():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  harness.add_cpu_flag(parser)
  size = parser.add_mutually_exclusive_group()
  size.add_argument('--small', action='store_true', help='tiny sizes for a quick check')
  size.add_argument('--qwen3-0.6b', dest='qwen3_0_6b', action='store_true',
                    help='issue 16 config: Qwen3-0.6B shape, bf16, 32 x G=8, P=128, T=512')
  parser.add_argument(
      '--sampled', action='store_true',
      help='draw at temperature 1 as RL rollouts do (CPU configs; default greedy, '
      'which the HF baseline needs)')
  parser.add_argument('--rounds', type=int, default=3, help='interleaved timed rounds')
  parser.add_argument(
      '--block_size', type=int, default=None,
      help='completion slots per attention block (default: sampler.resolve_block_size)')
  parser.add_argument('--layer_loop', default='auto', choices=sampler_lib.LAYER_LOOPS)
  parser.add_argument('--naive_steps', type=int, default=2,
                      help='naive full-recompute steps timed (extrapolated to T)')
  parser.add_argument('--skip_old', action='store_true', help='do not run the old jtc sampler')
  parser.add_argument('--skip_hf', action='store_true')
  parser.add_argument('--skip_naive', action='store_true')
  parser.add_argument('--skip_memory', action='store_true')
  return parser


def _machine_peaks(cpu):
  """(read bandwidth bytes/s, matmul FLOP/s), printed."""
  bandwidth = machine.read_bandwidth_bytes_per_s(1 << (28 if cpu else 30))
  peak_flops = machine.matmul_flops_per_s(dtype=jnp.float32 if cpu else jnp.bfloat16,
                                          n=2048 if cpu else 8192)
  print(f'read bandwidth           {bandwidth / 1e9:8.2f} GB/s (a reduction, best of 10)')
  print(f'matmul peak              {peak_flops / 1e9:8.2f} GFLOP/s '
        f'({"f32 2048" if cpu else "bf16 8192"}^3, best of 10)')
  return bandwidth, peak_flops


def _systems(args, params, config, prompt_BP, mask_BP, *, G, T, sampling, block_size, layer_loop):
  """{name: zero-argument call} of the systems compared (module docstring, item 1)."""
  kw = dict(rng=jax.random.key(1), num_samples=G, max_new_tokens=T, eos_id=EOS, pad_id=EOS,
            **sampling)
  systems = {
      'new jtc':
          lambda: sampler_lib.sample(params, config, prompt_BP, mask_BP, block_size=block_size,
                                     layer_loop=layer_loop, **kw)
  }
  if not args.skip_old:
    reference = load_reference_sampler()
    old_params = model_lib.unstack_layers(params)
    systems['old jtc'] = lambda: reference.sample(old_params, config, prompt_BP, mask_BP, **kw)
  if jax.default_backend() == 'cpu' and not args.skip_hf and sampling.get('greedy'):
    try:  # benchmarks/hf_baseline.py (torch + transformers); None if they are missing.
      from benchmarks import hf_baseline  # pylint: disable=g-import-not-at-top
      hf_run = hf_baseline.make_hf_generate(config, params, np.asarray(prompt_BP), T)
    except ImportError as e:
      print(f'(HF baseline unavailable: {e})')
    else:
      systems['HF generate'] = hf_run
  return systems


def _interleaved_runs(systems, rounds, n_rows, T):
  """Compile / warm up each system once and count the tokens it generates, then `rounds`
  interleaved timed calls. Returns (tokens, compile seconds, {name: [(tokens/s, OtherLoad)]})."""
  tokens, compile_s = {}, {}
  for name, fn in systems.items():
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    compile_s[name] = time.perf_counter() - start
    mask = out.completion_mask if name == 'old jtc' else out.completion_mask_RT
    tokens[name] = n_rows * T if name == 'HF generate' else int(mask.sum())
  if 'old jtc' in tokens:
    assert tokens['old jtc'] == tokens['new jtc'], tokens
  order = [n for n in ('old jtc', 'new jtc', 'HF generate') if n in systems]
  runs = {name: [] for name in order}
  for _ in range(rounds):
    for name in order:
      with harness.OtherLoad() as other:
        jax.block_until_ready(systems[name]())
      runs[name].append((tokens[name] / other.seconds, other))
  return tokens, compile_s, runs


def _print_throughput(runs, compile_s, floor, n_tokens, param_bytes, rounds):
  """Tokens/s of each system against its design's floor, and the ratios of the medians."""
  floors = {f'{d} jtc': n_tokens / floor[d][0] for d in ('old', 'new')}
  median = {name: statistics.median(t for t, _ in rs) for name, rs in runs.items()}
  print()
  print(f'decode roofline floor: new design {floors["new jtc"]:10.1f} tok/s '
        f'({floor["new"][1]:.0%} of steps compute-bound), old design {floors["old jtc"]:10.1f} '
        f'tok/s ({floor["old"][1]:.0%})  (per step the larger of: params '
        f'{param_bytes / 1e6:.0f} MB + the KV cache the design reads, at the read bandwidth; '
        'its FLOPs at the matmul peak)')
  print(f'tokens/s of {rounds} interleaved rounds (1-minute load average, and the cores '
        'other processes used during the call):')
  for name, rs in runs.items():
    print(f'  {name:11s} median {median[name]:9.1f}' +
          (f' = {median[name] / floors[name]:5.1%} of its floor' if name in floors else '') +
          f'; compile+first run {compile_s[name]:.1f}s')
    for t, other in rs:
      print(f'      {t:9.1f} ({harness.load_str(other)})')
  loaded = any(harness.is_loaded(o) for rs in runs.values() for _, o in rs)
  tag = (f'  LOADED: not a valid ratio (other processes used > {harness.MAX_OTHER_CORES} cores '
         'during a timed call)' if loaded else '')
  for other in ('old jtc', 'HF generate'):
    if other in median:
      print(f'ratio new jtc / {other:12s} {median["new jtc"] / median[other]:6.2f}x{tag}')
  return median['new jtc']


def _print_naive(params, config, prompt_BP, mask_BP, *, T, n_steps, new_tps):
  """Naive full recompute: `n_steps` of T timed and extrapolated, against the new sampler."""
  B, P = prompt_BP.shape
  step = naive_step_fn(config, P)
  toks = jnp.concatenate([prompt_BP, jnp.zeros((B, T), jnp.int32)], 1)
  mask = jnp.concatenate([mask_BP, jnp.zeros((B, T), jnp.int32)], 1)
  jax.block_until_ready(step(params, toks, mask, 0))
  start = time.perf_counter()
  state = (toks, mask)
  for t in range(n_steps):
    state = step(params, *state, t)
  jax.block_until_ready(state)
  naive_tps = B * T / ((time.perf_counter() - start) / n_steps * T)
  print(f'naive full recompute     {naive_tps:10.1f} tok/s -> new jtc is '
        f'{new_tps / naive_tps:.1f}x ({n_steps} of {T} steps timed, extrapolated)')


def _print_prefill(params, config, prompt_BP, mask_BP, *, G, T, block_size, peak_flops):
  """Prefill time against the matmul peak."""
  B, P = prompt_BP.shape
  prefill = jax.jit(lambda p, t, m: decode.prefill(p, config, t, m, num_samples=G, max_new_tokens=T,
                                                   block_size=block_size))
  jax.block_until_ready(prefill(params, prompt_BP, mask_BP))
  prefill_s = machine.median_time(lambda: prefill(params, prompt_BP, mask_BP), 3)
  non_embed = model_lib.num_params(params) - config.vocab_size * config.d_model
  prefill_flops = 2 * non_embed * B * P + attention_flops(
      config, B, P, P) + (2 * B * config.d_model * config.vocab_size)
  print(f'prefill                  {prefill_s * 1e3:8.1f} ms  {prefill_flops / 1e9:8.1f} GFLOP -> '
        f'{prefill_flops / prefill_s / peak_flops:6.1%} of matmul peak')


def _print_choice(R, V, sampling):
  print(f'token choice, {R} x {V} f32 logits (old / new, best of 5 interleaved rounds of 50):')
  for s, (t, other) in choice_seconds(load_reference_sampler()._choose, sampler_lib._choose, R, V,
                                      sampling).items():  # pylint: disable=protected-access
    print(f'  {s:8s} old {t["old"] * 1e3:7.3f} ms   new {t["new"] * 1e3:7.3f} ms   ratio '
          f'{t["old"] / t["new"]:5.2f}x ({harness.load_str(other)})' +
          ('  LOADED: not a valid ratio' if harness.is_loaded(other) else ''))


def _print_memory(B=16, T=1024, D=256, V=151_936):
  mem = logprob_memory(B, T, D, V, chunk=8192)
  print(f'token_logprobs memory, V={V:,} B*T={B * T:,} D={D} f32 '
        '(compiled arguments+outputs+temps / temps only):')
  for mode in ('fwd', 'fwd+bwd'):
    (cp, ct), (nps, nt) = mem['chunked', mode], mem['naive', mode]
    print(f'  {mode:8s} chunked(8192) {cp / 2**30:7.2f} GiB / {ct / 2**30:6.2f}   '
          f'naive {nps / 2**30:7.2f} GiB / {nt / 2**30:6.2f}   ratio {nps / cp:6.1f}x')


def main():
  args = _parser().parse_args()
  label, config, B, G, P, T, sampling = setups(args)
  cpu = jax.default_backend() == 'cpu'
  block_size = sampler_lib.resolve_block_size(args.block_size, T)
  layer_loop = sampler_lib.resolve_layer_loop(args.layer_loop)
  params = model_lib.init_params(config, jax.random.key(0))
  # EOS never wins the argmax (zero tied embedding row -> logit 0): greedy rows generate T.
  params['embed']['embedding'] = params['embed']['embedding'].at[EOS].set(0.0)
  param_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
  prompt_BP = jnp.asarray(
      np.random.default_rng(0).integers(1, config.vocab_size, (B, P)), jnp.int32)
  mask_BP = jnp.ones_like(prompt_BP)
  print(f'# jtc sampler benchmark: {label}, {model_lib.num_params(params) / 1e6:.1f}M params, '
        f'{B} prompts x G={G}, P={P}, T={T}, {sampling}; new: block_size={block_size} '
        f'layer_loop={layer_loop}')
  print(f'# {harness.device_line()}')
  bandwidth, peak_flops = _machine_peaks(cpu)

  systems = _systems(args, params, config, prompt_BP, mask_BP, G=G, T=T, sampling=sampling,
                     block_size=block_size, layer_loop=layer_loop)
  tokens, compile_s, runs = _interleaved_runs(systems, args.rounds, B * G, T)
  floor = decode_floor_seconds(config, param_bytes, B=B, G=G, P=P, T=T, block_size=block_size,
                               bandwidth=bandwidth, peak_flops=peak_flops)
  new_tps = _print_throughput(runs, compile_s, floor, tokens['new jtc'], param_bytes, args.rounds)
  if args.qwen3_0_6b:
    return
  # The CPU config's extras: naive recompute, prefill, token choice, log-prob memory.
  if not args.skip_naive:
    _print_naive(params, config, prompt_BP, mask_BP, T=T,
                 n_steps=T if args.small else min(args.naive_steps, T), new_tps=new_tps)
  _print_prefill(params, config, prompt_BP, mask_BP, G=G, T=T, block_size=block_size,
                 peak_flops=peak_flops)
  if not args.skip_old:
    _print_choice(B * G, config.vocab_size, sampling)
  if not args.skip_memory:
    _print_memory()


if __name__ == '__main__':
  main()
