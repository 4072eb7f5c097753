"""The mismatch attribution (jtc.analysis.mismatch): each source measured on the same tokens. A
filter only removes probability mass, so its delta is the log of the kept mass, never positive; a
float32 KV-cache decode agrees with the full forward pass to float rounding; bfloat16 does not."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jtc.analysis import mismatch
from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.models import bundles


def test_each_source_has_the_sign_and_size_it_must_have():
  bundle = bundles.load_policy_bundle('base')
  prompts = [
      e['prompt'] for e in tasks_lib.get_task('arithmetic').examples('test', seed=0, num_examples=8)
  ]
  tokens, mask = data_lib.encode_prompts(bundle.tokenizer, prompts, width=20)
  rows = {
      r['source'].split(':')[0].split(' (')[0]: r for r in mismatch.attribute(
          bundle.params, dataclasses.replace(bundle.model_config, dtype='float32'),
          jnp.asarray(tokens), jnp.asarray(mask), rng=jax.random.key(0), samples=2,
          max_new_tokens=24, eos_id=bundle.tokenizer.eos_id, pad_id=bundle.tokenizer.pad_id)
  }
  assert rows['decode']['mean_abs'] < 1e-5  # float32: rounding only
  assert rows['bf16 model vs float32 model']['mean_abs'] > 10 * rows['decode']['mean_abs']
  for name in ('top-k 5', 'top-p 0.9', 'min-p 0.1'):
    r = rows[name]
    assert r['mean'] < 0 and np.isclose(r['mean_abs'], -r['mean'], rtol=1e-3, atol=1e-6), r
  assert rows['temperature 0.7']['mean_abs'] > 1e-3  # a tempered distribution is another one
