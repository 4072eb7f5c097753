"""Peak memory and time per phase of one full RL step (sample -> score -> update), per model size.

  python benchmarks/memory.py                       # tiny default model and Qwen3-0.6B shape
  python benchmarks/memory.py --models tiny         # a quick check
  python benchmarks/memory.py --models qwen3_0_6b --prompts 2 --group 2 --new_tokens 32
  python benchmarks/memory.py --cpu                 # force CPU (host RSS)

Runs on whatever backend JAX finds (`--cpu` forces CPU). Peak memory is what the backend can
report, and each line says which: on a GPU/TPU the device's `memory_stats()['peak_bytes_in_use']`
(`peak_memory=device`), on CPU the process's peak resident set size (`peak_memory=host_rss`,
`ru_maxrss`; the host RSS is also printed on accelerators). Each model runs in its own
subprocess (so its peaks are its own) through `jtc.rl.trainer.Trainer.step` with random weights: the KV-cache sampler draws G completions
for each prompt, the rewards and the behaviour log-probs are computed ("score"), and one
optimiser step (AdamW on float32 master weights, bf16 compute, per-block remat for the large
model) updates the policy. Step 1 includes compilation; step 2 is the steady state. The
tokenizer is a character tokenizer (the random model's completions are gibberish; that is
fine for memory and time).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (ModelConfig preset, trainer overrides).
MODELS = {
    'tiny': ('tiny', dict(param_dtype='float32', compute_dtype='float32', remat=False)),
    'qwen3_0_6b': ('qwen3_0_6b', dict(param_dtype='float32', compute_dtype='bfloat16', remat=True)),
    'qwen3_1_7b': ('qwen3_1_7b', dict(param_dtype='float32', compute_dtype='bfloat16', remat=True)),
}


def _child(args):
  sys.path.insert(0, REPO)
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from configs import dfpo_min_replace  # pylint: disable=import-outside-toplevel
  from jtc.models import model as model_lib  # pylint: disable=import-outside-toplevel
  from jtc.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import trainer as trainer_lib  # pylint: disable=import-outside-toplevel

  class WideCharTokenizer(tokenizer_lib.CharTokenizer):
    """Characters for the prompts; ids beyond the alphabet decode to nothing."""

    def decode(self, ids):
      return super().decode(i for i in ids if int(i) < len(self.alphabet) + self.NUM_SPECIAL)

  preset, overrides = MODELS[args.child]
  tok = WideCharTokenizer()
  if preset == 'tiny':
    mc = model_lib.ModelConfig.tiny(vocab_size=tok.vocab_size)
  else:
    mc = getattr(model_lib.ModelConfig, preset)(max_seq_len=4096)
  c = dfpo_min_replace.get_config('smoke')
  with c.unlocked():
    c.rollout.prompts_per_step = args.prompts
    c.optim.minibatch_prompts = args.prompts
    c.rollout.sampling.num_samples = args.group
    c.rollout.sampling.max_new_tokens = args.new_tokens
    c.data.prompt_width = 20
    c.eval.every = 0
    c.log.diagnostics_every = 0
    c.num_steps = 2
    for k, v in overrides.items():  # the `policy` section: dtypes and remat
      c.policy[k] = v
  p = c.policy
  mc = dataclasses.replace(mc, param_dtype=p.param_dtype, dtype=p.compute_dtype, remat=p.remat)
  t0 = time.perf_counter()
  params = model_lib.init_params(mc, jax.random.key(0))
  jax.block_until_ready(params)
  t_init = time.perf_counter() - t0
  n_params = model_lib.num_params(params)
  with tempfile.TemporaryDirectory() as workdir:
    trainer = trainer_lib.Trainer(c, workdir, policy=(mc, params, tok))
    del params
    steps = []
    for step in (1, 2):
      m, = trainer.step(step)
      steps.append({k: round(m[k], 3) for k in ('time_sample', 'time_score', 'time_update')})
      steps[-1]['tokens'] = int(m['compute/generated_tokens'])
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
  device = jax.devices()[0]
  stats = device.memory_stats() if jax.default_backend() != 'cpu' else None
  peak = (stats or {}).get('peak_bytes_in_use')
  kind, peak_gib = ('device', peak / 2**30) if peak is not None else ('host_rss', rss_gib)
  print(
      json.dumps(
          dict(model=args.child, device=f'{jax.default_backend()}:{device.device_kind}',
               params=n_params, param_dtype=p.param_dtype, compute_dtype=p.compute_dtype,
               remat=p.remat, prompts=args.prompts, group=args.group, new_tokens=args.new_tokens,
               init_s=round(t_init, 2), step1_with_compile=steps[0], step2=steps[1],
               peak_memory=kind, peak_gib=round(peak_gib, 2), host_rss_gib=round(rss_gib, 2))))


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--models', default='tiny,qwen3_0_6b',
                 help=f'comma-separated subset of {sorted(MODELS)}')
  p.add_argument('--prompts', type=int, default=2)
  p.add_argument('--group', type=int, default=2)
  p.add_argument('--new_tokens', type=int, default=32)
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  p.add_argument('--cpu', action='store_true',
                 help='force the CPU backend (default: whatever backend JAX finds)')
  args = p.parse_args()
  if args.child:
    _child(args)
    return
  names = [m for m in args.models.split(',') if m]
  bad = [m for m in names if m not in MODELS]
  if bad:
    raise ValueError(f'unknown model(s) {bad}; valid: {sorted(MODELS)}')
  env = dict(os.environ)
  if args.cpu:
    env['JAX_PLATFORMS'] = 'cpu'
  for name in names:
    cmd = [
        sys.executable,
        os.path.abspath(__file__), '--child', name, f'--prompts={args.prompts}',
        f'--group={args.group}', f'--new_tokens={args.new_tokens}'
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
      print(f'{name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}', file=sys.stderr)
      continue
    print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == '__main__':
  main()
