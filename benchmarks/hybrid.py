"""Gated DeltaNet side by side on this machine: its two forms at training length, and decoding
with a hybrid against a full-attention model of the same size at a long context.

Run (on a quiet machine; the load average and the cores other processes used are printed beside
every figure):
  python -m benchmarks.hybrid --cpu
Quick check:
  python -m benchmarks.hybrid --cpu --small

Reports, measured in one run, `--rounds` times interleaved after one compile call each:
  forms   seconds of one Gated DeltaNet layer (`gated_deltanet.mix`, B=1, L=2048 tokens) in the
          chunked form (chunks of `linear_chunk`) and in the recurrent form (one token per scan
          step), forward and forward+backward: the ratio recurrent / chunked (> 1: the chunked
          form is faster);
  decode  tokens/s of the sampler (greedy, G rows) of a 4-layer hybrid (3 Gated DeltaNet + 1
          gated attention) and of the same model with all 4 layers full attention, after a
          prompt of P_short and of P_long tokens: a full-attention layer reads the whole prompt
          at every step, a linear one only its constant-size state.
A ratio is printed only when other processes used at most `harness.MAX_OTHER_CORES` cores
during every timed call it divides; otherwise "LOADED".
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import dataclasses
import statistics

import jax
import jax.numpy as jnp

from benchmarks import machine
from jtc.models import gated_deltanet
from jtc.models import model as model_lib
from jtc.models import sampler
from jtc.models.model_config import ModelConfig

L_, F_ = 'linear_attention', 'full_attention'


def _config(small):
  d = 64 if small else 256
  return ModelConfig.tiny_hybrid(vocab_size=512, d_model=d, n_heads=4, n_kv_heads=2,
                                 head_dim=d // 4, d_ff=3 * d, linear_n_k_heads=2,
                                 linear_n_v_heads=4, linear_k_head_dim=d // 4,
                                 linear_v_head_dim=d // 4, linear_chunk=64, max_seq_len=16_384)


def _timed(fn, rounds):
  """[(seconds, other cores, load)] of ``rounds`` calls of fn (compiled already)."""
  out = []
  for _ in range(rounds):
    with harness.OtherLoad() as o:
      machine.median_time(fn, 1)
    out.append((o.seconds, o.cores, o.load))
  return out


def _report(name, a, b, label_a, label_b):
  """Medians of two interleaved series and their ratio b / a (if the host was quiet)."""
  ma, mb = statistics.median(t for t, _, _ in a), statistics.median(t for t, _, _ in b)
  others = max(c for _, c, _ in a + b)
  load = max(l for _, _, l in a + b)
  quiet = others <= harness.MAX_OTHER_CORES
  ratio = f'{mb / ma:.2f}x' if quiet else 'LOADED: not a valid ratio'
  print(f'{name}: {label_a} {ma * 1e3:.1f} ms, {label_b} {mb * 1e3:.1f} ms; {label_b} / {label_a} '
        f'= {ratio} (other processes <= {others:.2f} cores, load average <= {load:.2f})')
  return mb / ma, quiet


def forms(config, L, rounds):
  p = gated_deltanet.init_params(config, jax.random.key(0))
  h = jax.random.normal(jax.random.key(1), (1, L, config.d_model))
  mask = jnp.ones((1, L), jnp.int32)
  results = {}
  for grad in (False, True):
    fns = {}
    for form in ('chunked', 'recurrent'):
      f = lambda p, form=form: jnp.sum(gated_deltanet.mix(p, h, mask, config, form=form)[0]**2)
      fns[form] = jax.jit(jax.grad(f) if grad else f)
      jax.block_until_ready(fns[form](p))
    series = {form: [] for form in fns}
    for _ in range(rounds):  # interleaved
      for form, fn in fns.items():
        series[form] += _timed(lambda fn=fn: fn(p), 1)
    name = f'Gated DeltaNet layer, L={L}, {"forward+backward" if grad else "forward"}'
    results[grad] = _report(name, series['chunked'], series['recurrent'], 'chunked', 'recurrent')
  return results


def decode(config, prompts, T, G, rounds):
  dense = dataclasses.replace(config, layer_types=(F_,) * config.n_layers)
  out = {}
  for P in prompts:
    tok_s = {}
    fns = {}
    for name, c in (('hybrid', config), ('full attention', dense)):
      params = model_lib.init_params(c, jax.random.key(0))
      prompt = jax.random.randint(jax.random.key(2), (1, P), 1, c.vocab_size)
      run = lambda params=params, c=c, prompt=prompt: sampler.sample(
          params, c, prompt, jnp.ones_like(prompt), rng=jax.random.key(
              3), num_samples=G, max_new_tokens=T, eos_id=0, pad_id=0, greedy=True).tokens_RL
      jax.block_until_ready(run())
      fns[name] = run
    series = {name: [] for name in fns}
    for _ in range(rounds):
      for name, fn in fns.items():
        series[name] += _timed(fn, 1)
    for name in fns:
      tok_s[name] = G * T / statistics.median(t for t, _, _ in series[name])
    print(f'decode after P={P}: hybrid {tok_s["hybrid"]:.0f} tokens/s, full attention '
          f'{tok_s["full attention"]:.0f} tokens/s (prefill included, G={G}, T={T})')
    out[P] = _report(f'decode after P={P} (seconds per call)', series['hybrid'],
                     series['full attention'], 'hybrid', 'full attention')
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--small', action='store_true', help='tiny shapes, for a quick check')
  parser.add_argument('--rounds', type=int, default=5)
  args = parser.parse_args()
  print(harness.device_line())
  config = _config(args.small)
  print(f'model: d_model={config.d_model}, {config.n_layers} layers {config.layer_types}, '
        f'Gated DeltaNet {config.linear_n_k_heads} key / {config.linear_n_v_heads} value heads of '
        f'{config.linear_k_head_dim}, chunk {config.linear_chunk}, float32')
  forms(config, 256 if args.small else 2048, args.rounds)
  prompts = (64, 512) if args.small else (256, 8192)
  decode(config, prompts, T=16 if args.small else 64, G=4, rounds=args.rounds)


if __name__ == '__main__':
  main()
