r"""The planner's GPU estimate against a real GPU: plan the Qwen3-0.6B real config with
`python -m jtc.plan --gpu`, then train it for a few steps on the GPU and print what the
trainer's preflight compiled, the memory each phase actually reached and the step times.

On one H100 / H200 (no network: the checkpoint is a randomly initialised Qwen3-0.6B-shaped
Hugging Face directory that `transformers` writes on the machine, the data a small GSM8K-format
JSONL written beside it; /work/shared/gpu/README.md for the wheels and PYTHONPATH):
  python -m benchmarks.gpu_preflight --gpu h100        # under 6 minutes; results in $OUT
The CPU check of this script (a tiny checkpoint, seconds per step):
  python -m benchmarks.gpu_preflight --tiny --cpu

Both runs use `configs/real/qwen3_0_6b_gsm8k_dfpo.py` with the same overrides, shrunk to fit the
time (`SHRINK`: 8 prompts x G = 8, 256 new tokens, no evaluation; `TINY` further for --tiny):
  1. `python -m jtc.plan --config ... --gpu KIND --gpus 1`: per stage the bytes and FLOPs of
     the XLA:CPU program with the GPU's roofline constants, labelled "estimate, not compiled for
     the GPU" (plan.txt);
  2. `jtc.rl.trainer.Trainer` (what `python -m jtc.train` runs) for `--steps` steps: its
     `preflight:` lines (each stage compiled for the GPU, `memory_analysis()` against
     `memory_stats()['bytes_limit']`), then per step the seconds of sample / score / update and
     the device's `memory_stats()['peak_bytes_in_use']` after each phase (a running peak: a
     phase that does not raise it needed no more than the phases before it) (train.txt).
summary.json holds the numbers. The GPU's memory is JAX's pool (75 % of HBM unless
XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise), which the preflight checks against.
"""

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

CONFIG = 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'
SHRINK = {
    'rollout.prompts_per_step': 8,
    'rollout.sampling.num_samples': 8,
    'rollout.sampling.max_new_tokens': 256,
    'rollout.chunk_prompts': 4,
    'optim.minibatch_prompts': 8,
    'optim.microbatch_prompts': 2,
    'eval.every': 0,
    'eval.sampling.max_new_tokens': 256,
}
TINY = {
    'rollout.prompts_per_step': 2,
    'rollout.sampling.num_samples': 2,
    'rollout.sampling.max_new_tokens': 8,
    'rollout.chunk_prompts': 1,
    'optim.minibatch_prompts': 2,
    'optim.microbatch_prompts': 1,
    'data.prompt_width': 160,
    'eval.sampling.max_new_tokens': 8,
}


def write_checkpoint(path, tiny):
  """A random Qwen3-0.6B-shaped (or tiny) checkpoint written by `transformers`, with a
  byte-level tokenizer (ids past its vocabulary decode to nothing)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from jtc.models import tokenizer  # pylint: disable=import-outside-toplevel
  tokenizer.write_byte_level_hf(path)
  sizes = (dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=128) if tiny else
           dict(vocab_size=151_936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128, intermediate_size=3072)
          )  # Qwen/Qwen3-0.6B config.json
  config = transformers.Qwen3Config(**sizes, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                                    tie_word_embeddings=True, max_position_embeddings=40_960)
  torch.manual_seed(0)
  transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def write_data(path):
  """A GSM8K-format train/test JSONL ('#### answer')."""
  os.makedirs(path, exist_ok=True)
  rows = [(f'What is {a} plus {b}?', f'{a} + {b} = {a + b}\n#### {a + b}')
          for a in range(1, 9)
          for b in range(1, 9)]
  for split, part in (('train', rows), ('test', rows[:8])):
    with open(os.path.join(path, f'{split}.jsonl'), 'w') as f:
      for q, a in part:
        f.write(json.dumps({'question': q, 'answer': a}) + '\n')


def run_plan(kind, overrides, log):
  """`python -m jtc.plan --gpu KIND --gpus 1` with the overrides; its output and seconds."""
  cmd = [
      sys.executable, '-m', 'jtc.plan', f'--config={CONFIG}', f'--gpu={kind}', '--gpus=1',
      '--stages=sample,behaviour,update'
  ]
  cmd += [f'--config.{k}={v}' for k, v in overrides.items()]
  log('$ ' + ' '.join(cmd))
  t0 = time.perf_counter()
  env = dict(os.environ, JAX_PLATFORMS='cpu')  # the --gpu estimate compiles for the host
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
  log(proc.stdout + proc.stderr)
  return proc.returncode, time.perf_counter() - t0


def _peak(device):
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  return stats.get('peak_bytes_in_use') if stats else None


def run_train(overrides, steps, workdir, log):
  """The trainer for ``steps`` steps, the device's running peak after each phase."""
  import jax  # pylint: disable=import-outside-toplevel
  from jtc.cli import absl_program  # pylint: disable=import-outside-toplevel
  from jtc.plan import suggest  # pylint: disable=import-outside-toplevel
  from jtc.rl import batch as batch_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  from jtc.rl import update as update_lib  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  peaks = {}

  def after(module, name, phase):
    fn = getattr(module, name)

    def wrapped(*args, **kwargs):
      out = fn(*args, **kwargs)
      jax.block_until_ready([x for x in jax.tree.leaves(out[0]) if isinstance(x, jax.Array)])
      peaks[phase] = _peak(device)
      return out

    setattr(module, name, wrapped)

  after(rollout_lib, 'collect', 'sample')
  after(batch_lib, 'make_batch', 'score')
  after(update_lib, 'run_updates', 'update')
  c = suggest.apply(absl_program.load_config(os.path.join(absl_program.REPO, CONFIG)), overrides)
  t0 = time.perf_counter()
  with contextlib.redirect_stderr(_Tee(sys.stderr, log, 'preflight:')):
    trainer = trainer_lib.Trainer(c, workdir)
  log(f'trainer built (preflight included) in {time.perf_counter() - t0:.1f} s on '
      f'{device.device_kind}; peak after build {_gib(_peak(device))}')
  rows = []
  try:
    for step in range(1, steps + 1):
      t = time.perf_counter()
      metrics = trainer.step(step)[0]
      row = {k: metrics[k] for k in ('time_sample', 'time_score', 'time_update')}
      row.update(step=step, seconds=time.perf_counter() - t, **{
          f'peak_after_{k}': v for k, v in peaks.items()
      })
      rows.append(row)
      log(f"step {step}: {row['seconds']:.1f} s (sample {row['time_sample']:.1f}, score "
          f"{row['time_score']:.1f}, update {row['time_update']:.1f}); device peak after sample "
          f"{_gib(peaks.get('sample'))}, score {_gib(peaks.get('score'))}, update "
          f"{_gib(peaks.get('update'))}")
  finally:
    trainer.close()
  return rows


class _Tee:
  """A stream that writes through to ``stream`` and logs the lines starting with ``prefix``."""

  def __init__(self, stream, log, prefix):
    self.stream, self.log, self.prefix = stream, log, prefix

  def write(self, text):
    for line in text.splitlines():
      if line.startswith(self.prefix):
        self.log(line)
    return self.stream.write(text)

  def flush(self):
    self.stream.flush()


def _gib(x):
  return 'n/a' if x is None else f'{x / 2**30:.2f} GiB'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  harness.add_cpu_flag(parser)
  parser.add_argument('--gpu', default='h100', choices=('h100', 'h200', 'a100'))
  parser.add_argument('--tiny', action='store_true', help='a tiny checkpoint: the CPU check')
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--out', default=os.environ.get('OUT') or tempfile.mkdtemp())
  args = parser.parse_args()
  out = os.path.join(args.out, 'gpu_preflight')
  os.makedirs(out, exist_ok=True)
  work = tempfile.mkdtemp()  # the checkpoint (1.2 GB) stays out of $OUT
  lines = []

  def log(text):
    print(text, flush=True)
    lines.append(text)

  t0 = time.perf_counter()
  write_checkpoint(os.path.join(work, 'ckpt'), args.tiny)
  write_data(os.path.join(work, 'data'))
  log(f'# {harness.device_line()}; checkpoint and data written in {time.perf_counter() - t0:.1f} s')
  overrides = {
      **SHRINK,
      **(TINY if args.tiny else {}), 'num_steps': args.steps,
      'policy.checkpoint': os.path.join(work, 'ckpt'),
      'data.dataset': os.path.join(work, 'data'),
      'data.data_dir': os.path.join(work, 'cache')
  }
  rc, plan_s = run_plan(args.gpu, overrides, log)
  log(f'plan exited {rc} after {plan_s:.1f} s')
  with open(os.path.join(out, 'plan.txt'), 'w') as f:
    f.write('\n'.join(lines))
  lines.clear()
  rows = run_train(overrides, args.steps, os.path.join(work, 'run'), log)
  with open(os.path.join(out, 'train.txt'), 'w') as f:
    f.write('\n'.join(lines))
  with open(os.path.join(out, 'summary.json'), 'w') as f:
    json.dump({
        'plan_rc': rc,
        'plan_seconds': plan_s,
        'steps': rows,
        'overrides': overrides
    }, f, indent=1)
  print(f'# results in {out}; {time.perf_counter() - t0:.0f} s in all')


if __name__ == '__main__':
  main()
