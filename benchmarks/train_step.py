"""RL trainer throughput: the update step's MFU at real-model shapes, the update step of the
default config against a matmul peak, and one RL step's phases.

Run (on whatever backend JAX finds; `--cpu` forces CPU):
  python -m benchmarks.train_step                       # GPU/TPU: MFU of Qwen3-0.6B, 64 x 640
  python -m benchmarks.train_step --mfu_shape qwen3_1_7b
The update step on the ~26M-parameter benchmark model instead:
  python -m benchmarks.train_step --model small_25m
Quick check, and the CPU form of the MFU section (the 0.6B layer shapes with 2 layers, 4
sequences x 128 tokens, float32; about 2 minutes on 2 cores):
  python -m benchmarks.train_step --small

0. MFU of the update step at a real model's shape (`--mfu_shape`, default qwen3_0_6b): random
   weights (float32 master, bf16 compute; float32 on CPU), per-block remat, the trainer's own
   jitted update (`jtc.rl.step.build`: DFPO Min-Replace, AdamW) on 64 sequences (8 groups of G = 8) x
   640 tokens (P = 128, T = 512), median of `--repeats` after compilation (compile time
   printed). Model FLOPs per step (forward + backward, the usual MFU count; remat's extra
   forward is not counted):
       6 * N_trunk * B * L  +  6 * D * V * B * T  +  12 * Y * N * H * B * L^2
   (N_trunk: parameters except the embedding, which is a lookup on the way in; the LM head
   D x V runs on the T completion positions only; the last term is QK^T and PV over the full
   [L, L] score matrix). MFU = model FLOPs / seconds / peak, peak = the best FLOP/s of a
   jitted bf16 8192^3 matmul measured here (CPU: f32 2048^3).

Reports, measured in one run:
1. The matmul peak of this machine (`benchmarks.machine.matmul_flops_per_s`: best FLOP/s of a
   jitted f32 [n, n] @ [n, n], best of 10; on a shared machine other jobs only slow a run down).
2. The trainer's jitted, buffer-donating update (`jtc.rl.step.build`; loss, optimiser and
   mini-batch shape of the config: minibatch_prompts * group_size sequences of L = prompt_width + max_new_tokens
   tokens): seconds per step (median of `--repeats` after a compile call), tokens/s (all B * L
   tokens that go through forward + backward, and the B * T completion tokens), and FLOP/s as
   a fraction of the peak, with the FLOPs counted two ways:
     - XLA: `jax.jit(update).lower(...).compile().cost_analysis()['flops']`, what the compiled
       program executes (includes the optimiser, the rematerialised LM-head chunk, ...);
     - model: 6 * N_trunk * B * L + 6 * D * V * B * T (LM head on the completion only)
       + 12 * n_layers * N * H * B * L^2 (QK^T and PV over the full [L, L] score matrix,
       forward + backward), the usual MFU count.
   XLA counts a loop body once, so with micro-batches (config.microbatch_prompts) or
   V > vocab_chunk the XLA count is too low; read the model count then.
3. One RL step of the config through `jtc.rl.trainer.Trainer` (the shipped base policy
   `jtc/assets/base_policy`, or a random tiny policy bundle when it is not there yet): mean
   seconds of the trainer's own phase timers over `--rl_steps` steps after one warm-up step
   (so compiles are excluded) and each phase's share. The phases are the trainer's:
     sample = prompt batch + KV-cache sampling of G completions + host-side rewards;
     score  = advantages + behaviour log-prob forward pass (+ DelTA / KL extras);
     update = ppo_epochs x (prompts_per_step / minibatch_prompts) update steps.
   The periodic diagnostics pass (`diagnostics_every`) and evaluation are switched off here;
   they are not part of a plain RL step.
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import dataclasses
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.machine import matmul_flops_per_s
from configs import dfpo_min_replace
from jtc.models import bundles
from jtc.rl import checkpoints
from jtc.models import model as model_lib
from jtc.rl import rollout
from jtc.rl import sharding
from jtc.rl import step as step_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import trainer as trainer_lib
from jtc.rl import update

CHAR_SPEC = {'kind': 'char'}


def tiny_for_task(vocab_size):
  return model_lib.ModelConfig.tiny(vocab_size=vocab_size)


def small_25m_for_task(vocab_size):
  return model_lib.ModelConfig.small_25m(vocab_size=vocab_size)


# --model: the policy architecture, given the task tokenizer's vocabulary (see `policies`).
MODELS = {'tiny': tiny_for_task, 'small_25m': small_25m_for_task}


def get_config(small):
  """The default RL config (`configs/dfpo_min_replace.py`), or its smoke variant."""
  c = dfpo_min_replace.get_config('smoke' if small else None)
  c.log.diagnostics_every = 0
  c.eval.every = 0
  return c


def has_base_policy():
  return os.path.exists(os.path.join(bundles.BASE_POLICY_DIR, 'params.msgpack'))


def random_policy(model_config, workdir, name):
  """Writes a randomly initialised policy bundle (char tokenizer) and returns its path."""
  path = os.path.join(workdir, name)
  bundles.save_policy_bundle(path, model_config=model_config,
                             params=model_lib.init_params(model_config, jax.random.key(0)),
                             tokenizer_spec=CHAR_SPEC, meta={
                                 'made_by': 'benchmarks/train_step.py',
                                 'kind': 'random init'
                             })
  return path


def policies(model_name, workdir):
  """{'update': (path, label), 'rl': (path, label)}: the policies the two sections start from.

  tiny: the shipped base policy for both (a random tiny bundle while it does not exist).
  small_25m: its benchmark preset (V = 8192) for the update step; for the RL step, which
  samples and decodes text, the same architecture with the task tokenizer's vocabulary.
  """
  vocab_size = tokenizer_lib.from_spec(CHAR_SPEC).vocab_size
  if model_name == 'tiny':
    if has_base_policy():
      rl = ('base', 'shipped base policy')
    else:
      rl = (random_policy(tiny_for_task(vocab_size), workdir,
                          'tiny'), 'random tiny policy (no jtc/assets/base_policy yet)')
    return {'update': rl, 'rl': rl}
  return {
      'update': (random_policy(model_lib.ModelConfig.small_25m(), workdir,
                               'small_25m'), 'random small_25m preset'),
      'rl': (random_policy(MODELS[model_name](vocab_size), workdir,
                           f'{model_name}_char'), f'random {model_name} policy, char vocabulary')
  }


# ---------------------------------------------------------------------------------------------
# The update step on its own.
# ---------------------------------------------------------------------------------------------


def update_batch(params, model_config, *, B, P, T, G, n_micro, seed=0):
  """A mini-batch shaped like the trainer's: B rows of whole groups of G, L = P + T columns.

  Every leaf is [n, B / n, ...] (n micro-batches of whole groups, `update.update_step`'s
  layout). Tokens are random, every position is real (no padding) and every completion is
  full length, so each timed step does the most work the shape allows.
  """
  rng = np.random.default_rng(seed)
  tokens_BL = jnp.asarray(rng.integers(1, model_config.vocab_size, (B, P + T)), jnp.int32)
  input_mask_BL = jnp.ones_like(tokens_BL)
  old = rollout.behaviour_pass(params, tokens_BL, input_mask_BL, model_config=model_config,
                               completion_start=P, return_hidden=False)
  rewards_G = rng.normal(size=(B // G, G))
  adv_B = (rewards_G - rewards_G.mean(-1, keepdims=True)) / rewards_G.std(-1, keepdims=True)
  batch = update.Batch(tokens_BL=tokens_BL, input_mask_BL=input_mask_BL, mask_BT=jnp.ones(
      (B, T), jnp.float32), advantages_B=jnp.asarray(adv_B.reshape(B), jnp.float32),
                       old_logps_BT=old['logps'])
  return update.minibatch(batch, jnp.arange(B), num_micro=n_micro)


def model_flops(model_config, n_params, *, B, P, T):
  """Forward + backward FLOPs by the usual count (see the module docstring)."""
  L = P + T
  c = model_config
  head = c.d_model * c.vocab_size
  n_trunk = n_params - head  # the (tied) embedding matrix is a lookup on the way in
  attention = 12 * c.n_layers * c.n_heads * c.head_dim * B * L * L
  return 6 * n_trunk * B * L + 6 * head * B * T + attention


def xla_flops(compiled):
  """`cost_analysis()['flops']` of a compiled function (older jax returns a list of dicts)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get('flops', float('nan')))


def compile_and_time_update(c, model_config, params, batch, *, P, G, repeats):
  """Compiles the trainer's own update (`jtc.rl.step.build`'s, config `c`'s loss and optimiser,
  on one device, for ``batch``'s [n, B / n, ...] shape) and times it: the median of `repeats`
  calls after one warm-up. Returns n_params, compile_s, seconds, loss, compiled."""
  n, rows = batch.tokens_BL.shape[:2]
  c = c.copy_and_resolve_references()
  with c.unlocked():
    c.rollout.prompts_per_step = c.optim.minibatch_prompts = n * rows // G
    c.optim.microbatch_prompts = rows // G
    c.rollout.sampling.num_samples, c.data.prompt_width = G, P
    c.rollout.sampling.max_new_tokens = batch.tokens_BL.shape[-1] - P
    c.mesh.update(population=1, data=1, fsdp=1, tensor=1)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  built = step_lib.build(c, mesh, model_config, params=params, schedule_steps=1000)
  state, _, _ = built.materialise(jax.device_get(params))
  n_params = model_lib.num_params(params)
  start = time.perf_counter()
  compiled = built.update.lower(state, batch, {}).compile()
  compile_s = time.perf_counter() - start
  state, metrics = compiled(state, batch, {})
  jax.block_until_ready((state, metrics))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = compiled(state, batch, {})
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  return dict(n_params=n_params, compile_s=compile_s, seconds=statistics.median(times),
              loss=float(metrics['loss']), compiled=compiled)


def time_update_step(c, *, repeats):
  """Median seconds per jitted `update.update_step` plus its FLOP counts; returns a dict.

  The policy is `c.policy.init` loaded as the trainer loads it (`checkpoints.load_policy`, so the
  config's param/compute dtype, remat and model overrides apply), on one device.
  """
  G, P, T = c.rollout.sampling.num_samples, c.data.prompt_width, c.rollout.sampling.max_new_tokens
  B = c.optim.minibatch_prompts * G
  model_config, params, _ = checkpoints.load_policy(c.policy)
  params = jax.tree.map(jnp.asarray, params)
  n_micro = update.num_microbatches(c.optim)
  infer_config = dataclasses.replace(model_config, remat=False)
  batch = update_batch(params, infer_config, B=B, P=P, T=T, G=G, n_micro=n_micro)
  timed = compile_and_time_update(c, model_config, params, batch, P=P, G=G, repeats=repeats)
  n_params = timed['n_params']
  return dict(B=B, L=P + T, T=T, n_micro=n_micro, model_config=model_config, n_params=n_params,
              seconds=timed['seconds'], compile_s=timed['compile_s'],
              xla_flops=xla_flops(timed['compiled']), loss=timed['loss'],
              model_flops=model_flops(model_config, n_params, B=B, P=P, T=T))


MFU_SHAPES = ('qwen3_0_6b', 'qwen3_1_7b')


def time_mfu(shape, *, B, P, T, G, repeats, n_layers=None, compute_dtype='bfloat16'):
  """Median seconds, compile seconds and model FLOPs of one update step at a preset's shape."""
  overrides = dict(max_seq_len=max(P + T, 1024), param_dtype='float32', dtype=compute_dtype,
                   remat=True)
  if n_layers:
    overrides['n_layers'] = n_layers
  mc = getattr(model_lib.ModelConfig, shape)(**overrides)
  c = get_config(False)
  start = time.perf_counter()
  params = jax.block_until_ready(model_lib.init_params(mc, jax.random.key(0)))
  init_s = time.perf_counter() - start
  batch = update_batch(params, dataclasses.replace(mc, remat=False), B=B, P=P, T=T, G=G, n_micro=1)
  timed = compile_and_time_update(c, mc, params, batch, P=P, G=G, repeats=repeats)
  n_params = timed['n_params']
  return dict(model_config=mc, n_params=n_params, init_s=init_s, compile_s=timed['compile_s'],
              seconds=timed['seconds'], flops=model_flops(mc, n_params, B=B, P=P, T=T))


# ---------------------------------------------------------------------------------------------
# One RL step, phase by phase.
# ---------------------------------------------------------------------------------------------

PHASES = ('sample', 'score', 'update')


def time_rl_steps(c, *, n_steps):
  """Runs 1 warm-up + `n_steps` trainer steps; returns (per-step metrics, wall seconds)."""
  with tempfile.TemporaryDirectory(prefix='jtc_bench_') as workdir:
    trainer = trainer_lib.Trainer(c, os.path.join(workdir, 'run'))
    trainer.step(1)  # compiles the sampler, the behaviour pass and the update step
    steps, walls = [], []
    for step in range(2, n_steps + 2):
      start = time.perf_counter()
      steps.extend(trainer.step(step))
      walls.append(time.perf_counter() - start)
    trainer.close()
  return steps, walls


def _rate(x):
  return f'{x / 1e3:9.1f}k' if x < 1e6 else f'{x / 1e6:9.2f}M'


def _parser():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true',
                      help='smoke config, smaller matmul probe, fewer repeats (quick check)')
  parser.add_argument('--model', default='tiny', choices=sorted(MODELS),
                      help='policy architecture (tiny = the default policy)')
  parser.add_argument('--repeats', type=int, default=None, help='timed update steps')
  parser.add_argument('--rl_steps', type=int, default=None,
                      help='timed RL steps after the warm-up step')
  parser.add_argument('--skip_rl', action='store_true', help='only the update step')
  parser.add_argument('--mfu_shape', default='qwen3_0_6b', choices=MFU_SHAPES,
                      help='model shape of the MFU section')
  parser.add_argument('--skip_mfu', action='store_true', help='no MFU section')
  harness.add_cpu_flag(parser)
  return parser


def _print_mfu(shape, small, cpu):
  """The MFU section: the full shape on an accelerator, a reduced one with --small."""
  n_mfu, dt = (2048, jnp.float32) if cpu else (8192, jnp.bfloat16)
  mfu_peak = matmul_flops_per_s(n=n_mfu, dtype=dt)
  B, G, P, T = (4, 4, 32, 96) if small else (64, 8, 128, 512)
  u = time_mfu(shape, B=B, P=P, T=T, G=G, repeats=2 if small else 5, n_layers=2 if small else None,
               compute_dtype='float32' if cpu else 'bfloat16')
  mc, s_ = u['model_config'], u['seconds']
  print()
  print(f'MFU of the update step, {shape} shape{" with 2 layers" if small else ""} '
        f'({u["n_params"] / 1e6:.0f}M params, master f32, compute {mc.dtype}, remat), '
        f'{B} sequences x {P + T} tokens (P={P}, T={T}), G={G}:')
  print(f'  init_params {u["init_s"]:.1f}s, compile {u["compile_s"]:.1f}s, '
        f'{s_ * 1e3:.0f} ms/step (median)')
  print(f'  model FLOPs = 6*N_trunk*B*L + 6*D*V*B*T + 12*Y*N*H*B*L^2 = {u["flops"] / 1e12:.3f} '
        f'TFLOP/step -> {u["flops"] / s_ / 1e12:.3f} TFLOP/s')
  print(f'  peak {mfu_peak / 1e12:.3f} TFLOP/s ({"f32" if cpu else "bf16"} {n_mfu}^3 '
        f'matmul, best of 10) -> MFU {u["flops"] / s_ / mfu_peak:6.1%}')


def _print_update(u, label, repeats, peak):
  mc, s = u['model_config'], u['seconds']
  print()
  print(f'update step ({label}: {u["n_params"] / 1e6:.2f}M params, V={mc.vocab_size}, '
        f'{mc.dtype}; mini-batch B={u["B"]} x L={u["L"]} (T={u["T"]}) in {u["n_micro"]} '
        f'micro-batch(es); median of {repeats}, compile {u["compile_s"]:.1f}s)')
  print(f'  time                 {s * 1e3:8.1f} ms/step')
  print(f'  tokens/s             {_rate(u["B"] * u["L"] / s)} (B*L tokens, forward+backward)'
        f'   {_rate(u["B"] * u["T"] / s).strip()} completion tokens/s')
  for name, key in (('XLA cost_analysis', 'xla_flops'), ('model 6N + attn', 'model_flops')):
    flops = u[key]
    print(f'  {name:20s} {flops / 1e9:8.2f} GFLOP/step -> {flops / s / 1e9:7.2f} GFLOP/s = '
          f'{flops / s / peak:6.1%} of matmul peak')


def _print_rl(c, steps, walls, label):
  mean = {p: statistics.mean(m[f'time_{p}'] for m in steps) for p in PHASES}
  total = sum(mean.values())
  n_updates = update.updates_per_step(c.optim, c.rollout.prompts_per_step)
  G = c.rollout.sampling.num_samples
  print()
  print(f'RL step ({label}; {c.rollout.prompts_per_step} prompts x G={G}, '
        f'T<={c.rollout.sampling.max_new_tokens}, {n_updates} update steps of '
        f'{c.optim.minibatch_prompts * G}'
        f' rows; mean of {len(steps)} steps after 1 warm-up step)')
  for p in PHASES:
    print(f'  {p:8s} {mean[p]:8.3f} s  {mean[p] / total:6.1%}')
  print(f'  {"total":8s} {total:8.3f} s  (wall per step {statistics.mean(walls):.3f} s; '
        f'{statistics.mean(m["tokens_per_s"] for m in steps):.0f} generated tokens/s; mean '
        f'completion length {statistics.mean(m["response_length"] for m in steps):.1f})')
  return n_updates


def main():
  args = _parser().parse_args()
  repeats = args.repeats or (3 if args.small else 10)
  rl_steps = args.rl_steps or (2 if args.small else 4)
  c = get_config(args.small)
  cpu = jax.default_backend() == 'cpu'

  print(f'# jtc train-step benchmark: configs/dfpo_min_replace.py{":smoke" if args.small else ""}'
        f' (loss {c.loss.name}), --model {args.model}')
  print(f'# {harness.device_line()}')
  n = 1024 if args.small else 2048
  peak = matmul_flops_per_s(n=n)
  print(f'matmul peak            {peak / 1e9:8.2f} GFLOP/s ({n}^3 f32 matmul, best of 10)')
  if not args.skip_mfu and (args.small or not cpu):
    _print_mfu(args.mfu_shape, args.small, cpu)
  elif not args.skip_mfu:
    print('(MFU section: the 0.6B shape at 64 x 640 is for GPU/TPU; on CPU run --small)')

  with tempfile.TemporaryDirectory(prefix='jtc_policy_') as policy_dir:
    policy = policies(args.model, policy_dir)
    c.policy.init, label = policy['update']
    u = time_update_step(c, repeats=repeats)
    _print_update(u, label, repeats, peak)
    if args.skip_rl:
      return
    c.policy.init, label = policy['rl']
    steps, walls = time_rl_steps(c, n_steps=rl_steps)
  n_updates = _print_rl(c, steps, walls, label)
  if policy['rl'] == policy['update']:
    print(f'  (isolated update step x {n_updates} = {n_updates * u["seconds"]:.3f} s with '
          'full-length completions, for comparison with the update phase)')


if __name__ == '__main__':
  main()
