"""Hugging Face `transformers` greedy `generate()` throughput on the same weights as jtc.

The jtc params are exported with `jtc.hf_import.export_hf_checkpoint` to a temporary
directory and loaded with `transformers.AutoModelForCausalLM` (torch, CPU, float32, default
SDPA attention, KV cache on). `benchmarks/sampler.py` calls `hf_generate_tokens_per_s` for
its side-by-side ratio.

Run on its own (``--small`` for a quick check on a 2-core machine):

  python -m benchmarks.hf_baseline            # ~25M params, batch 32, prompt 64, 256 new
  python -m benchmarks.hf_baseline --small
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from jtc import hf_import
from jtc import model as model_lib


def hf_generate_tokens_per_s(config: model_lib.ModelConfig, params, prompt_tokens_BP,
                             max_new_tokens: int, *, num_threads: int = 2,
                             repeats: int = 1) -> float | None:
  """Generated tokens per second of HF greedy `generate` (B * max_new_tokens / seconds).

  Every row generates exactly `max_new_tokens` tokens (no EOS), prompts are unpadded
  (all real tokens). One short warm-up call is not timed; the best of `repeats` timed
  calls is reported.

  Args:
    config, params: the jtc model (any supported dtype; run in float32 on CPU).
    prompt_tokens_BP: [B, P] int prompt ids.
    max_new_tokens: tokens to generate per row.
    num_threads: torch intra-op threads (2 on this machine).
    repeats: timed calls.

  Returns:
    tokens/s, or None if torch/transformers are not installed.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  prompt_BP = torch.from_numpy(np.asarray(prompt_tokens_BP, np.int64))
  B = prompt_BP.shape[0]
  old_threads = torch.get_num_threads()
  torch.set_num_threads(num_threads)
  try:
    with tempfile.TemporaryDirectory() as tmp:
      hf_import.export_hf_checkpoint(config, params, tmp, torch_dtype='float32')
      hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp).float().eval()

    def run(n):
      with torch.inference_mode():
        out = hf_model.generate(
            input_ids=prompt_BP, attention_mask=torch.ones_like(prompt_BP), do_sample=False,
            max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0,
            use_cache=True)
      assert out.shape == (B, prompt_BP.shape[1] + n), out.shape
      return out

    run(2)  # warm-up
    best = float('inf')
    for _ in range(repeats):
      start = time.perf_counter()
      run(max_new_tokens)
      best = min(best, time.perf_counter() - start)
  finally:
    torch.set_num_threads(old_threads)
  return B * max_new_tokens / best


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='tiny sizes for a quick check')
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
