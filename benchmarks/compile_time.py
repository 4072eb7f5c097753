"""Compile (and init) time against depth: init_params, the first update step, the sampler.

  python -m benchmarks.compile_time [--cpu] [--depths 2,4,8,16]
  PYTHONPATH=/path/to/older/checkout python benchmarks/compile_time.py   # the same, for old code

For a small model (d_model 256, 4 heads, d_ff 768, V 512) at each depth, in a fresh process
per depth (no shared compilation caches), it times:
  init       the first `model.init_params` call (tracing + compilation + run);
  update     `jax.jit(update_step).lower(...).compile()` of the default config's loss
             (DFPO Min-Replace, AdamW) on 8 sequences x 96 tokens, remat on;
  sampler    the first `sampler.sample` call minus a second (compiled) one: 4 prompts x G=2,
             P=32, T=64, T=1 sampling; with the stacked-layer code once per layer loop
             ('scan': one scanned layer body; 'unroll': one body per layer).
Only public APIs are used, so an older checkout (per-layer modules) runs it unchanged and the
two can be compared. Self-contained (imports nothing from benchmarks/) for that reason.
"""
import argparse
import inspect
import json
import os
import subprocess
import sys
import time

if '--cpu' in sys.argv:
  os.environ['JAX_PLATFORMS'] = 'cpu'


def _child(n_layers):
  sys.path.append(os.getcwd())  # after PYTHONPATH: an older checkout there wins
  import dataclasses  # pylint: disable=import-outside-toplevel
  import functools  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from configs import dfpo_min_replace  # pylint: disable=import-outside-toplevel
  from jtc.models import model as model_lib  # pylint: disable=import-outside-toplevel
  from jtc.models import sampler as sampler_lib  # pylint: disable=import-outside-toplevel

  mc = model_lib.ModelConfig.tiny(vocab_size=512, n_layers=n_layers, d_model=256, n_heads=4,
                                  n_kv_heads=2, head_dim=64, d_ff=768, remat=True)
  out = dict(n_layers=n_layers, backend=jax.default_backend())
  start = time.perf_counter()
  params = jax.block_until_ready(model_lib.init_params(mc, jax.random.key(0)))
  out['init_s'] = round(time.perf_counter() - start, 2)

  c = dfpo_min_replace.get_config(None)
  B, G, P, T = 8, 4, 32, 64
  rng = np.random.default_rng(0)
  batch = dict(tokens_BL=jnp.asarray(rng.integers(1, 512, (1, B, P + T)), jnp.int32),
               input_mask_BL=jnp.ones((1, B, P + T), jnp.int32), mask_BT=jnp.ones(
                   (1, B, T), jnp.float32), advantages_B=jnp.asarray(rng.normal(size=(1, B)),
                                                                     jnp.float32),
               old_logps_BT=jnp.full((1, B, T), -1.0, jnp.float32))
  from jtc.rl import update as update_lib  # pylint: disable=import-outside-toplevel
  optimizer = update_lib.make_optimizer(c.optim, 1000)
  batch = update_lib.Batch(**batch)
  state = update_lib.TrainState(step=jnp.array(0, jnp.int32), params=params,
                                opt_state=optimizer.init(params))
  update = jax.jit(
      functools.partial(update_lib.update_step, model_config=mc, optimizer=optimizer,
                        loss_name=c.loss.name, loss_hparams=c.loss.hparams.to_dict(),
                        completion_start=P, group_size=G))
  start = time.perf_counter()
  update.lower(state, batch).compile()
  out['update_compile_s'] = round(time.perf_counter() - start, 2)

  infer = dataclasses.replace(mc, remat=False)
  prompts = jnp.asarray(rng.integers(1, 512, (4, 32)), jnp.int32)
  kw = dict(rng=jax.random.key(1), num_samples=2, max_new_tokens=64, eos_id=0, pad_id=0)
  loops = ([None] if 'layer_loop' not in inspect.signature(sampler_lib.sample).parameters else
           ['scan', 'unroll'])
  for loop in loops:
    extra = {} if loop is None else dict(layer_loop=loop)
    run = lambda: sampler_lib.sample(params, infer, prompts, jnp.ones_like(prompts), **kw, **extra)
    start = time.perf_counter()
    jax.block_until_ready(run())
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(run())
    out[f'sampler_compile_s{"" if loop is None else "_" + loop}'] = round(
        first - (time.perf_counter() - start), 2)
  print(json.dumps(out))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--depths', default='2,4,8,16')
  p.add_argument('--cpu', action='store_true', help='force the CPU backend')
  p.add_argument('--child', type=int, default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child is not None:
    _child(args.child)
    return
  print(f'# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start')
  for depth in [int(d) for d in args.depths.split(',')]:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f'--child={depth}'] +
        (['--cpu'] if args.cpu else []), env=os.environ, capture_output=True, text=True,
        check=False)
    if proc.returncode:
      print(f'depth {depth}: failed\n{proc.stderr[-3000:]}', file=sys.stderr)
      continue
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    line['load'] = round(os.getloadavg()[0], 1)
    print(json.dumps(line), flush=True)


if __name__ == '__main__':
  main()
