r"""Where the rollout-training mismatch comes from: delta_t = log pi_train - log pi_sampler measured
source by source, each on the same sampled tokens, with everything else held equal.

  python -m jtc.analysis.mismatch [--policy base] [--prompts 64] [--samples 4] [--out FILE.md]

The sampler's log-probs (`jtc.models.sampler`) are those of the distribution it drew from: the
logits divided by the temperature, filtered by top-k / top-p / min-p and renormalised, computed in
its compute dtype through its KV cache. That is what an importance ratio needs (the probability
of the token under the behaviour distribution), and it is why they differ from the trainer's,
which are the model's own distribution at temperature 1 from one full forward pass
(`jtc.models.logprobs`). The sources, one row each:

  decode         the sampler's KV-cache decode vs one full forward pass (same dtype, T = 1, no
                 filter): float rounding of another computation order only
  chunked        the trainer's vocabulary-chunked online log-sum-exp (8 columns a chunk) vs a
                 plain log-softmax of the full logits
  bf16 model     every matmul in bfloat16 vs float32 (the trainer's log-probs either way)
  bf16 head      only the LM head's input in bfloat16
  temperature    a sampler at T != 1 reports log-probs of the tempered distribution
  top-k/p, min-p the filtered, renormalised distribution: delta = log of the kept mass on the
                 token's context, always <= 0

Each row gives, over the real tokens, the mean delta (its bias), mean / 99th percentile / max
|delta| and the mean |sum_t delta_t| per sequence (the log of its importance weight). The whole
table is measured for a float32 policy and again for the same policy in bfloat16.

Dimension key (docs/dimensions.md): B prompts, R = B * G sampled rows, P prompt width,
T completion length, L = P + T, D model dim, V vocabulary.
"""

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models import sampler as sampler_lib
from jtc import files
from jtc.models import bundles

FILTERS = (('temperature 0.7', dict(temperature=0.7)), ('top-k 5', dict(top_k=5)),
           ('top-p 0.9', dict(top_p=0.9)), ('min-p 0.1', dict(min_p=0.1)))


def full_forward_logps(params, config, tokens_BL, mask_BL, P):
  """log softmax of the full [B, L, V] logits of one forward pass (no chunking), at the
  completion positions: the plain reference."""
  out = model_lib.forward(params, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                          mask_BL)
  logp_BLV = jax.nn.log_softmax(out.logits_BLV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp_BLV[:, P - 1:-1], tokens_BL[:, P:, None], axis=-1)[..., 0]


def summary(name, delta_BT, mask_BT):
  """One table row of delta over the real tokens."""
  real = np.asarray(mask_BT) > 0
  d = np.asarray(delta_BT, np.float64)
  a = np.abs(d[real])
  return {
      'source': name,
      'tokens': int(real.sum()),
      'mean': float(d[real].mean()),
      'mean_abs': float(a.mean()),
      'p99_abs': float(np.quantile(a, 0.99)),
      'max_abs': float(a.max()),
      'seq_mean_abs': float(np.abs((d * real).sum(-1)).mean())
  }


def attribute(params, config, tokens_BP, mask_BP, *, rng, samples, max_new_tokens, eos_id, pad_id):
  """The table's rows for one policy (``config.dtype`` is the sampler's and the trainer's)."""
  P = tokens_BP.shape[1]
  sample = lambda key, **kw: sampler_lib.sample(params, config, tokens_BP, mask_BP, rng=key,
                                                num_samples=samples, max_new_tokens=max_new_tokens,
                                                eos_id=eos_id, pad_id=pad_id, **kw)
  plain = sample(rng)
  toks, mask, cmask = plain.tokens_RL, plain.input_mask_RL, plain.completion_mask_RT
  ref = full_forward_logps(params, config, toks, mask, P)
  lp = lambda c, **kw: logprobs.sequence_logprobs(params, c, toks, mask, completion_start=P, **kw)[
      'logps']
  f32, bf16 = (dataclasses.replace(config, dtype=d) for d in ('float32', 'bfloat16'))
  hidden = logprobs.sequence_logprobs(params, f32, toks, mask, completion_start=P,
                                      return_hidden=True)['hidden']
  head = model_lib.lm_head_DV(params, f32)
  bf16_head, _ = logprobs.token_logprobs(hidden.astype(jnp.bfloat16), head, toks[:, P:])
  rows = [
      summary('decode (KV cache) vs full forward', ref - plain.logps_RT, cmask),
      summary('chunked log-probs (chunks of 8) vs full log-softmax',
              lp(config, vocab_chunk=8) - ref, cmask),
      summary('bf16 model vs float32 model',
              lp(bf16) - lp(f32), cmask),
      summary('bf16 LM-head input vs float32', bf16_head - lp(f32), cmask),
  ]
  for i, (name, kw) in enumerate(FILTERS):
    out = sample(jax.random.fold_in(rng, i + 1), **kw)
    model = full_forward_logps(params, config, out.tokens_RL, out.input_mask_RL, P)
    rows.append(
        summary(f'{name}: model (T = 1, unfiltered) vs sampler', model - out.logps_RT,
                out.completion_mask_RT))
  return rows


def markdown(tables):
  """{title: rows} -> a markdown table per policy."""
  lines = []
  for title, rows in tables.items():
    lines += [
        f'**{title}**', '', '| source | tokens | mean delta | mean abs | p99 abs | max abs | '
        'seq mean abs |', '|---|---|---|---|---|---|---|'
    ]
    lines += [
        f'| {r["source"]} | {r["tokens"]} | {r["mean"]:+.2e} | {r["mean_abs"]:.2e} | '
        f'{r["p99_abs"]:.2e} | {r["max_abs"]:.2e} | {r["seq_mean_abs"]:.2e} |' for r in rows
    ]
    lines.append('')
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--policy', default='base', help="a policy bundle ('base' = the shipped one)")
  parser.add_argument('--task', default='arithmetic')
  parser.add_argument('--prompts', type=int, default=64)
  parser.add_argument('--samples', type=int, default=4)
  parser.add_argument('--max_new_tokens', type=int, default=32)
  parser.add_argument('--prompt_width', type=int, default=20)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default=None, help='also write the tables to this markdown file')
  args = parser.parse_args(argv)
  bundle = bundles.load_policy_bundle(args.policy)
  task = tasks_lib.get_task(args.task)
  prompts = [e['prompt'] for e in task.examples('test', seed=args.seed, num_examples=args.prompts)]
  tokens_BP, mask_BP = data_lib.encode_prompts(bundle.tokenizer, prompts, width=args.prompt_width)
  tables = {}
  for dtype in ('float32', 'bfloat16'):
    config = dataclasses.replace(bundle.model_config, dtype=dtype)
    tables[f'{args.policy} policy, compute {dtype}'] = attribute(bundle.params, config,
                                                                 jnp.asarray(tokens_BP),
                                                                 jnp.asarray(mask_BP),
                                                                 rng=jax.random.key(args.seed),
                                                                 samples=args.samples,
                                                                 max_new_tokens=args.max_new_tokens,
                                                                 eos_id=bundle.tokenizer.eos_id,
                                                                 pad_id=bundle.tokenizer.pad_id)
  text = markdown(tables)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  with files.report_damage():
    main()
