"""Hugging Face `transformers` greedy `generate()` throughput on the same weights as jtc.

The jtc params are exported with `jtc.models.hf_import.export_hf_checkpoint` to a temporary
directory and loaded with `transformers.AutoModelForCausalLM` (torch, CPU, float32, default
SDPA attention, KV cache on, all host cores). `benchmarks/sampler.py` calls `hf_generate_tokens_per_s` for
its side-by-side ratio.

Run on its own (``--small`` for a quick check on a 2-core machine):

  python -m benchmarks.hf_baseline            # ~25M params, batch 32, prompt 64, 256 new
  python -m benchmarks.hf_baseline --small
"""
from __future__ import annotations

from benchmarks import harness  # first: --cpu must act before jax is imported

import argparse
import os
import tempfile
import time

import numpy as np

from jtc.models import hf_import
from jtc.models import model as model_lib


def make_hf_generate(config: model_lib.ModelConfig, params, prompt_tokens_BP, max_new_tokens: int,
                     *, num_threads: int | None = None):
  """A callable that runs HF greedy `generate` once on the same weights (or None without
  torch/transformers); call it once to warm up, then time calls (interleaved with others).

  Every row generates exactly `max_new_tokens` tokens (no EOS), prompts are unpadded (all real
  tokens), torch runs on the CPU in float32 with `num_threads` intra-op threads (default: all
  host cores, as XLA:CPU uses).
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  prompt_BP = torch.from_numpy(np.asarray(prompt_tokens_BP, np.int64))
  B = prompt_BP.shape[0]
  torch.set_num_threads(num_threads or os.cpu_count() or 1)
  with tempfile.TemporaryDirectory() as tmp:
    hf_import.export_hf_checkpoint(config, params, tmp, torch_dtype='float32')
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp).float().eval()

  def run():
    with torch.inference_mode():
      out = hf_model.generate(input_ids=prompt_BP, attention_mask=torch.ones_like(prompt_BP),
                              do_sample=False, max_new_tokens=max_new_tokens,
                              min_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0,
                              use_cache=True)
    assert out.shape == (B, prompt_BP.shape[1] + max_new_tokens), out.shape
    return out.numpy()

  return run


def hf_generate_tokens_per_s(config: model_lib.ModelConfig, params, prompt_tokens_BP,
                             max_new_tokens: int, *, repeats: int = 1) -> float | None:
  """Generated tokens per second of HF greedy `generate` (B * max_new_tokens / best seconds
  of `repeats` calls after a warm-up call), or None without torch/transformers."""
  run = make_hf_generate(config, params, prompt_tokens_BP, max_new_tokens)
  if run is None:
    return None
  run()
  best = min(_seconds(run) for _ in range(repeats))
  return len(prompt_tokens_BP) * max_new_tokens / best


def _seconds(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='tiny sizes for a quick check')
  harness.add_cpu_flag(parser)
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  if args.small:
    config = model_lib.ModelConfig.tiny(vocab_size=512)
    B, P, T = 4, 16, 32
  else:
    config = model_lib.ModelConfig.small_25m()
    B, P, T = 32, 64, 256
  params = model_lib.init_params(config, jax.random.PRNGKey(0))
  prompt_BP = np.random.default_rng(0).integers(0, config.vocab_size, (B, P))
  tps = hf_generate_tokens_per_s(config, params, prompt_BP, T)
  print(f'params={model_lib.num_params(params):,} B={B} P={P} T={T} '
        f'hf_generate_tokens_per_s={tps if tps is None else round(tps, 1)}')


if __name__ == '__main__':
  main()
