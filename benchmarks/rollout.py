"""Rollout throughput of the sampler's two schedulers side by side: useful completion tokens/s.

Run (CPU; each setup's systems timed `--rounds` times INTERLEAVED after one compile call each):
  python -m benchmarks.rollout [--cpu] [--rounds 3] [--setups shipped,long_tail]
  python -m benchmarks.rollout --small          # tiny sizes, a quick check
  python -m benchmarks.rollout --setups qwen3_0_6b --slots 2 --json r.json   # an accelerator

Setups (rows R = prompts x G, sampled at temperature 1):
  shipped    the shipped policy (jtc/assets/base_policy) on held-out arithmetic prompts, the
             default config's rollout shape (16 prompts x G=8, prompt width 20, T=32): its own
             length distribution.
  long_tail  a test policy whose lengths are long-tailed like reasoning lengths, with the shape
             under control: `small_25m` (26M parameters, f32) with an untied, zeroed LM head, so
             every next token is uniform over the V ids and the first of k = V / mean EOS ids
             ends a row at each token with probability 1 / mean: lengths are geometric with mean
             `--mean` (64), truncated at T = 4 x mean, so p99 = T ~ 4.1 x the mean (16 prompts
             x G=8, prompt width 16). The decode's compute is that of any 26M model.
  qwen3_0_6b the same test policy at the Qwen3-0.6B shape (bf16, untied head zeroed; 32
             prompts x G=8, prompt width 128, mean 128, T=512): for an accelerator
             (benchmarks/device_check.sh).
  rl_step    whole RL steps (python -m jtc.train, configs/grpo.py, the shipped policy, 64 new
             tokens, continuous with 32 slots, sampler log-probs, no evaluation) with partial
             rollouts off and on (`--max_decode_steps`, 8), each to the same token budget
             (`--token_budget`, 30000 trained tokens), interleaved: trained tokens per second of
             the steps' own time (their sample + score + update timers, step 1's compilation
             left out) and the final reward.
Systems: `static` (every row decodes until the last has ended) and `continuous` at slot counts
R / d for d in `--slots` (default 1,2,4: the CPU's default of every row, R/2, R/4). Useful tokens are the sampled tokens up to
and including EOS (the completion mask); tokens/s is their count over the call's wall time
(prefill included), the median of the rounds. Beside every figure: the 1-minute load average
and the cores other processes kept busy during the timed calls (`harness.OtherLoad`; a ratio
taken while others used more than `harness.MAX_OTHER_CORES` is marked LOADED). Each setup also
checks that both schedulers drew the same tokens.
"""
from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jtc.analysis import metric_writer
from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.models import bundles
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib

PAD = 0


def long_tail_policy(config, mean, seed=0):
  """(params, eos_ids) of a test policy whose completion lengths are geometric with ``mean``:
  random weights with an untied LM head of zeros (uniform next tokens) and k = V / mean EOS ids
  (the ids 1 .. k; 0 is the pad)."""
  if config.tie_embeddings:
    raise ValueError('long_tail_policy needs tie_embeddings=False (its LM head is zeroed)')
  params = model_lib.init_params(config, jax.random.key(seed))
  params['lm_head']['kernel'] = jnp.zeros_like(params['lm_head']['kernel'])
  k = max(1, round(config.vocab_size / mean))
  return params, tuple(range(1, k + 1))


def shipped_setup(prompts, G, T, prompt_width):
  """(label, params, config, tokens_BP, mask_BP, sampler kwargs) of the shipped policy."""
  bundle = bundles.load_policy_bundle('base')
  task = tasks_lib.get_task('arithmetic')
  examples = task.examples('test', seed=0, num_examples=prompts)
  tokens_BP, mask_BP = data_lib.encode_prompts(bundle.tokenizer, [e['prompt'] for e in examples],
                                               width=prompt_width)
  kw = dict(num_samples=G, max_new_tokens=T, eos_id=bundle.tokenizer.eos_id,
            pad_id=bundle.tokenizer.pad_id, temperature=1.0)
  return (f'shipped base policy, {prompts} prompts x G={G}, T={T}', bundle.params,
          bundle.model_config, jnp.asarray(tokens_BP), jnp.asarray(mask_BP), kw)


def long_tail_setup(config, prompts, G, mean, prompt_width):
  """As `shipped_setup`, for the long-tailed test policy (module docstring)."""
  params, eos_ids = long_tail_policy(config, mean)
  rng = np.random.default_rng(0)
  lengths_B = rng.integers(prompt_width // 2, prompt_width + 1, size=prompts)
  mask_BP = (np.arange(prompt_width)[None] >= prompt_width - lengths_B[:, None]).astype(np.int32)
  tokens_BP = np.where(mask_BP,
                       rng.integers(len(eos_ids) + 1, config.vocab_size,
                                    size=mask_BP.shape), PAD).astype(np.int32)
  kw = dict(num_samples=G, max_new_tokens=4 * mean, eos_id=eos_ids, pad_id=PAD, temperature=1.0)
  return (f'long-tailed test policy ({config.vocab_size} ids, {len(eos_ids)} EOS: geometric '
          f'mean {mean}, T={4 * mean}), {prompts} prompts x G={G}', params, config,
          jnp.asarray(tokens_BP), jnp.asarray(mask_BP), kw)


def systems(R, slot_counts):
  """{name: extra sampler kwargs}: static, then continuous at each slot count."""
  out = {'static': dict(scheduler='static')}
  for n in slot_counts:
    if 1 <= n <= R:
      out[f'continuous slots={n}'] = dict(scheduler='continuous', slots=n)
  return out


def measure(params, config, tokens_BP, mask_BP, kw, named, rounds):
  """{name: (tokens/s of each round, OtherLoad of the timed calls)}, interleaved, plus
  {name: lengths_R} of the first call and whether every system drew the static tokens."""
  key = jax.random.key(1)
  call = lambda extra: sampler_lib.sample(params, config, tokens_BP, mask_BP, rng=key, **kw, **extra
                                         )
  first = {n: jax.block_until_ready(call(extra)) for n, extra in named.items()}  # compile
  same = all(np.array_equal(o.completion_RT, first['static'].completion_RT) for o in first.values())
  rates = {n: [] for n in named}
  with harness.OtherLoad() as other:
    for _ in range(rounds):
      for n, extra in named.items():
        start = time.perf_counter()
        out = jax.block_until_ready(call(extra))
        rates[n].append(float(np.sum(out.completion_mask_RT)) / (time.perf_counter() - start))
  lengths_R = np.asarray(first['static'].completion_mask_RT).sum(1)
  return rates, other, lengths_R, same


def report(label, rates, other, lengths_R, same):
  """Prints one setup's table; returns {name: median tokens/s}."""
  mean, p99 = lengths_R.mean(), np.percentile(lengths_R, 99)
  print(f'\n{label}')
  print(f'  lengths: mean {mean:.1f}, p99 {p99:.0f} ({p99 / mean:.1f} x mean), max '
        f'{lengths_R.max()}; same tokens under every scheduler: {"yes" if same else "NO"}')
  print(f'  timed calls: {harness.load_str(other)}'
        f'{"  LOADED: not a valid ratio" if harness.is_loaded(other) else ""}')
  med = {n: statistics.median(r) for n, r in rates.items()}
  for n, r in rates.items():
    print(f'  {n:22s} {med[n]:9.0f} tok/s  (rounds: {", ".join(f"{x:.0f}" for x in r)})  '
          f'{med[n] / med["static"]:.2f} x static')
  return med


def _parser():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--small', action='store_true', help='tiny sizes for a quick check')
  parser.add_argument('--rounds', type=int, default=3, help='interleaved timed rounds')
  parser.add_argument('--setups', default='shipped,long_tail')
  parser.add_argument('--mean', type=int, default=64, help='long_tail: mean completion length')
  parser.add_argument('--prompts', type=int, default=16)
  parser.add_argument('--num_samples', type=int, default=8)
  parser.add_argument('--slots', default='1,2,4', help='continuous at R / d slots for each d')
  parser.add_argument('--json', default='', help='also write the medians and lengths here')
  parser.add_argument('--token_budget', type=int, default=30000, help='rl_step: per run')
  parser.add_argument('--max_decode_steps', type=int, default=8, help='rl_step: partial runs')
  return parser


def main(argv=None):
  args = _parser().parse_args(argv)
  print(f'benchmarks.rollout: {harness.device_line()}, load {harness.load_average():.1f} at start')
  results = {}
  for name in args.setups.split(','):
    if name == 'rl_step':
      results[name] = rl_steps(args)
      continue
    label, *run = setup(name, args)
    R = run[2].shape[0] * run[4]['num_samples']
    named = systems(R, [R // int(d) for d in args.slots.split(',')])
    rates, other, lengths_R, same = measure(*run, named, args.rounds)
    results[name] = dict(label=label, tokens_per_s=report(label, rates, other, lengths_R, same),
                         load=other.load, other_cores=other.cores, same_tokens=same,
                         mean_length=float(lengths_R.mean()),
                         p99_length=float(np.percentile(lengths_R, 99)))
  print(f'\nload {harness.load_average():.1f} at the end')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(dict(device=harness.device_line(), setups=results), f, indent=1)
  return results


def rl_steps(args):
  """The rl_step setup (module docstring): {partial off / on: [trained tokens/s of each round]}."""
  flags = [
      '--config=configs/grpo.py', '--config.rollout.scheduler=continuous',
      '--config.rollout.decode_slots=32', '--config.rollout.behaviour_logps=sampler',
      '--config.rollout.sampling.max_new_tokens=64', '--config.eval.every=0',
      '--config.num_steps=100000', f'--config.token_budget={args.token_budget}'
  ]
  if args.small:
    flags[0] = '--config=configs/grpo.py:smoke'
    flags[-1] = '--config.token_budget=300'
  runs = {
      'partial off': [],
      f'partial on (max_decode_steps={args.max_decode_steps})': [
          f'--config.rollout.max_decode_steps={args.max_decode_steps}'
      ]
  }
  rates, rewards = {n: [] for n in runs}, {n: [] for n in runs}
  loads = []
  with tempfile.TemporaryDirectory() as root:
    for r in range(args.rounds):
      for i, (name, extra) in enumerate(runs.items()):
        workdir = os.path.join(root, f'{r}_{i}')
        with harness.OtherLoad() as other:
          subprocess.run(
              [sys.executable, '-m', 'jtc.train', f'--workdir={workdir}', *flags, *extra],
              check=True, capture_output=True, text=True)
        loads.append(other)
        records = [
            s for s in metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
            if s['step'] >= 1
        ]
        first, steps = records[0], records[1:]  # step 1 compiles: left out
        seconds = sum(s['time_sample'] + s['time_score'] + s['time_update'] for s in steps)
        tokens = records[-1]['compute/generated_tokens'] - first['compute/generated_tokens']
        rates[name].append(tokens / max(seconds, 1e-9))
        rewards[name].append(records[-1]['reward_mean'])
  print(f'\nRL steps to a budget of {args.token_budget} trained tokens, partial rollouts off / on')
  worst = max(loads, key=lambda o: o.cores)
  print(f'  runs: {harness.load_str(worst)} (the most loaded run)'
        f'{"  LOADED: not a valid ratio" if harness.is_loaded(worst) else ""}')
  base = statistics.median(rates['partial off'])
  for name in runs:
    med = statistics.median(rates[name])
    print(f'  {name:38s} {med:8.0f} trained tok/s (rounds: '
          f'{", ".join(f"{x:.0f}" for x in rates[name])}), final reward '
          f'{statistics.median(rewards[name]):.3f}  {med / base:.2f} x off')
  return dict(tokens_per_s=rates, rewards=rewards)


def setup(name, args):
  """(label, params, config, tokens_BP, mask_BP, sampler kwargs) of setup ``name``."""
  B, G = (2, 4) if args.small else (args.prompts, args.num_samples)
  if name == 'shipped':
    return shipped_setup(B, G, 8 if args.small else 32, 20)
  if name == 'long_tail':
    config = (model_lib.ModelConfig.tiny(vocab_size=64, tie_embeddings=False)
              if args.small else model_lib.ModelConfig.small_25m(tie_embeddings=False))
    return long_tail_setup(config, B, G, 4 if args.small else args.mean, 16)
  if name == 'qwen3_0_6b':
    config = model_lib.ModelConfig.qwen3_0_6b(tie_embeddings=False, max_seq_len=4096)
    if args.small:
      config = dataclasses.replace(config, n_layers=2, vocab_size=512, dtype='float32',
                                   param_dtype='float32')
    return long_tail_setup(config, B if args.small else 32, G, 4 if args.small else 128,
                           16 if args.small else 128)
  raise ValueError(f'--setups: unknown setup {name!r}; valid: shipped, long_tail, qwen3_0_6b')


if __name__ == '__main__':
  main()
