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
  routing        (a mixture-of-experts policy) the decode row split by whether the token's
                 top-W experts differ between the sampler and the full forward pass in any layer
                 (a routing flip), and again with the sampler's routing replayed in the forward
                 pass; below, the flip rates per layer, the share of |delta| on flipped tokens
                 and the share of mean |delta| that the replay removes (the routing share of
                 the mismatch: a flip also moves the later tokens of its row, through attention,
                 so the flipped tokens' own share undercounts it)

`routing_flips` and `routing_metrics` are the routing source's instrument (also logged per
training step); its known-positive control perturbs the sampler's router weights only
(`perturb_router`), its negative control is the same float32 policy on both sides.

Each row gives, over the real tokens, the mean delta (its bias), mean / 99th percentile / max
|delta| and the mean |sum_t delta_t| per sequence (the log of its importance weight). The whole
table is measured for a float32 policy and again for the same policy in bfloat16.

Dimension key (docs/dimensions.md): B prompts, R = B * G sampled rows, P prompt width,
T completion length, L = P + T, D model dim, V vocabulary, Y layers, W experts per token.
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


def routing_flips(sampler_experts_BTYW, trainer_experts_BTYW):
  """[B, T, Y] bool: the layers in which a token's set of W experts differs between the sampler
  and the trainer (order within the set ignored). Tokens the sampler did not route (-1) count as
  no flip."""
  known_BTY = sampler_experts_BTYW[..., 0] >= 0
  sampler_sorted = jnp.sort(sampler_experts_BTYW.astype(jnp.int32), axis=-1)
  trainer_sorted = jnp.sort(trainer_experts_BTYW.astype(jnp.int32), axis=-1)
  return known_BTY & jnp.any(sampler_sorted != trainer_sorted, axis=-1)


def routing_metrics(flips_BTY, delta_BT, mask_BT):
  """The routing source over the real tokens of ``mask_BT``: 'flip_rate' (the share of tokens
  with a flip in some layer), 'flip_rate_layer' [Y] (per layer), 'abs_delta_share' (the share of
  sum |delta| that is on flipped tokens), 'flipped_mean_abs' / 'kept_mean_abs' (mean |delta| on
  tokens with and without a flip; 0 where there are none). delta = log pi_train - log
  pi_sampler."""
  real_BT = mask_BT > 0
  n = jnp.maximum(jnp.sum(real_BT), 1)
  flips_BTY = flips_BTY & real_BT[..., None]
  flip_BT = jnp.any(flips_BTY, axis=-1)
  abs_BT = jnp.where(real_BT, jnp.abs(delta_BT), 0.0)
  mean_on = lambda m: jnp.sum(jnp.where(m, abs_BT, 0.0)) / jnp.maximum(jnp.sum(m), 1)
  return {
      'flip_rate':
          jnp.sum(flip_BT) / n,
      'flip_rate_layer':
          jnp.sum(flips_BTY, axis=(0, 1)) / n,
      'abs_delta_share':
          jnp.sum(jnp.where(flip_BT, abs_BT, 0.0)) / jnp.maximum(jnp.sum(abs_BT), 1e-30),
      'flipped_mean_abs':
          mean_on(flip_BT),
      'kept_mean_abs':
          mean_on(real_BT & ~flip_BT),
  }


def perturb_router(params, scale, rng):
  """``params`` with every router kernel R replaced by R + scale * std(R) * N(0, 1): the routing
  source's known-positive control (a sampler whose experts differ from the trainer's, nothing
  else changed)."""
  mlp = params['layers']['mlp']
  router = mlp['router']['kernel']
  noise = jax.random.normal(rng, router.shape, router.dtype) * scale * jnp.std(router)
  layers = {**params['layers'], 'mlp': {**mlp, 'router': {'kernel': router + noise}}}
  return {**params, 'layers': layers}


def routing_rows(params, sampler_params, config, tokens_BP, mask_BP, *, rng, samples,
                 max_new_tokens, eos_id, pad_id):
  """The routing source of a mixture-of-experts policy sampled with ``sampler_params`` and scored
  with ``params``: (table rows, `routing_metrics` of the decode delta)."""
  P = tokens_BP.shape[1]
  out = sampler_lib.sample(sampler_params, config, tokens_BP, mask_BP, rng=rng, num_samples=samples,
                           max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                           return_routing=True)
  toks, mask, cmask = out.tokens_RL, out.input_mask_RL, out.completion_mask_RT
  score = lambda **kw: logprobs.sequence_logprobs(params, config, toks, mask, completion_start=P, **
                                                  kw)
  own = score()
  delta_RT = own['logps'] - out.logps_RT
  flips_RTY = routing_flips(out.experts_RLYW[:, P:], own['experts'])
  replayed_RT = score(replay_BLYW=out.experts_RLYW)['logps'] - out.logps_RT
  flip_RT = np.asarray(jnp.any(flips_RTY, axis=-1))
  cmask = np.asarray(cmask)
  rows = [('decode vs full forward', delta_RT, cmask),
          ('  on tokens with a routing flip', delta_RT, cmask * flip_RT),
          ('  on tokens without', delta_RT, cmask * ~flip_RT),
          ("  with the sampler's routing replayed", replayed_RT, cmask)]
  metrics = routing_metrics(flips_RTY, delta_RT, cmask)
  abs_mean = lambda d: jnp.sum(jnp.abs(d) * cmask) / jnp.maximum(jnp.sum(cmask), 1)
  # The routing share of the mismatch, counterfactually: what replaying the sampler's routing
  # removes of mean |delta| (a flip also moves every later token of its row, through attention).
  metrics['replay_removed_share'] = 1 - abs_mean(replayed_RT) / jnp.maximum(
      abs_mean(delta_RT), 1e-30)
  return [summary(*row) for row in rows if row[2].sum()], metrics


def routing_line(title, metrics):
  """One markdown line of `routing_metrics`."""
  layers = ', '.join(f'{float(r):.3f}' for r in metrics['flip_rate_layer'])
  return (f'{title}: flip rate {float(metrics["flip_rate"]):.4f} (per layer {layers}); share of '
          f'|delta| on flipped tokens {float(metrics["abs_delta_share"]):.3f}; mean |delta| '
          f'{float(metrics["flipped_mean_abs"]):.2e} with a flip, '
          f'{float(metrics["kept_mean_abs"]):.2e} without; replaying the sampler\'s routing '
          f'removes {float(metrics["replay_removed_share"]):.3f} of mean |delta|')


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


def routing_markdown(bundle, tokens_BP, mask_BP, args, scale=0.3):
  """The routing tables of a float32 mixture-of-experts policy: the same weights in the sampler
  and the trainer, then the sampler's router perturbed by ``scale`` (`perturb_router`)."""
  config = dataclasses.replace(bundle.model_config, dtype='float32')
  kw = dict(rng=jax.random.key(args.seed), samples=args.samples, max_new_tokens=args.max_new_tokens,
            eos_id=bundle.tokenizer.eos_id, pad_id=bundle.tokenizer.pad_id)
  lines = []
  for title, sampler_params in (('routing, same float32 weights', bundle.params),
                                (f'routing, sampler router perturbed ({scale} std)',
                                 perturb_router(bundle.params, scale,
                                                jax.random.key(args.seed + 1)))):
    rows, metrics = routing_rows(bundle.params, sampler_params, config, tokens_BP, mask_BP, **kw)
    lines += [markdown({title: rows}), routing_line(title, metrics), '']
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
  if bundle.model_config.is_moe:  # routing: the negative control, then the positive one
    text += '\n' + routing_markdown(bundle, jnp.asarray(tokens_BP), jnp.asarray(mask_BP), args)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  with files.report_damage():
    main()
