"""Held-out evaluation: avg@k of every population member on the same problems, with common random
numbers (`crn_hash`), its sampling error (`sampling_se`), the unbiased pass@j estimates from the
same k samples (`pass_at_k`, Chen et al. 2021), and the equivalent-format shares of the correct
samples (`format_metrics`, also logged per training step).

Problems with a ``data_source`` (verl rows) are also scored per source (`by_source`:
``<source>/avg@k``, ``<source>/pass@j``; in the trainer ``eval/<source>/...``).

Dimension key (docs/dimensions.md): M problems, G samples per problem (k), B rows, E population
members.
"""

import json
import math
import zlib

import jax
import numpy as np

from jtc.rl.rollout import is_correct


def format_metrics(task, texts, correct_B):
  """Share of each equivalent solution format among the correct completions and its entropy
  (nats); {} for a task without formats or when nothing is correct."""
  formats = getattr(task, 'formats', ())
  names = [task.format_of(t) for t, ok in zip(texts, correct_B) if ok] if formats else []
  if not names:
    return {}
  counts = np.array([names.count(f) for f in formats], np.float64)
  p = counts / max(counts.sum(), 1)
  nz = p[p > 0]
  out = {f'format/{f}': float(v) for f, v in zip(formats, p)}
  out['format/entropy'] = float(-(nz * np.log(nz)).sum())
  return out


def evaluate(gen, params, examples, rng, *, sampling, batch_prompts, task=None):
  """avg@k accuracy (k = sampling['num_samples']) of every member on the same held-out
  ``examples`` and the format shares of its correct samples: a dict per member. Prompts go
  ``batch_prompts`` at a time (the last batch padded by repeating its last prompt, so one shape
  compiles); batch s uses fold_in(member key, s), ``rng`` being the members' keys, stacked.

  The draws depend on ``examples`` (in order), the member's key, ``batch_prompts`` and
  ``sampling`` only, never on how training batches its rollouts (the trainer passes
  config.eval.batch_prompts). 'crn' is a hash of exactly those: the problems in order, the batch
  shape and every key the sampler was given (`crn_hash`), so two runs with equal 'crn' were
  evaluated with common random numbers."""
  pop, k = gen.population, sampling['num_samples']
  correct, texts = [[] for _ in range(pop.n)], [[] for _ in range(pop.n)]
  keys = []
  for s in range(0, len(examples), batch_prompts):
    chunk = examples[s:s + batch_prompts]
    n_real = len(chunk)
    chunk = chunk + [chunk[-1]] * (batch_prompts - n_real)
    keys.append(pop.fold_in(rng, s))
    outs = gen.sample(params, [[e['prompt'] for e in chunk]] * pop.n, keys[-1], sampling)
    n_keep = n_real * k
    rep = [e for e in chunk[:n_real] for _ in range(k)]
    for m, out in enumerate(outs):
      chunk_texts = gen.decode(out.completion_RT[:n_keep], out.completion_mask_RT[:n_keep])
      rewards = gen.reward_fn([e['prompt'] for e in rep], list(chunk_texts),
                              [e['answer'] for e in rep])
      correct[m].append(is_correct(rewards))
      texts[m] += chunk_texts
  results = []
  keys_M = [pop.unstack(key) for key in keys]  # [batches][members]
  for m, (c_m, t_m) in enumerate(zip(correct, texts)):
    c_m = np.concatenate(c_m)
    results.append({
        f'avg@{k}': float(c_m.mean()),
        f'avg@{k}_se': sampling_se(c_m.reshape(-1, k)),
        **{
            f'pass@{j}': pass_at_k(c_m.reshape(-1, k), j) for j in pass_ks(k)
        }, 'crn': crn_hash([e['prompt'] for e in examples], [key[m] for key in keys_M],
                           batch_prompts=batch_prompts, sampling=sampling),
        **format_metrics(task, t_m, c_m),
        **by_source([e.get('data_source', '') for e in examples], c_m.reshape(-1, k))
    })
  return results


def by_source(sources, correct_MG):
  """``{'<source>/avg@k', '<source>/pass@j'}`` of the problems of each ``data_source`` (verl's
  per-source validation metrics), when the problems have any; {} otherwise. ``sources``: [M]."""
  if not any(sources):
    return {}
  out, k = {}, correct_MG.shape[1]
  for source in sorted(set(sources)):
    rows_MG = correct_MG[[s == source for s in sources]]
    name = source or '(none)'
    out[f'{name}/avg@{k}'] = float(rows_MG.mean())
    out.update({f'{name}/pass@{j}': pass_at_k(rows_MG, j) for j in pass_ks(k)})
  return out


def pass_ks(n):
  """The j of the pass@j logged from n samples per problem: 1, 2, 4, ... up to n, and n."""
  return tuple(sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n}))


def pass_at_k(correct_MG, k):
  """Unbiased pass@k from G >= k samples per problem (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", Eq. 1): the mean over the M problems of
  1 - C(G - c, k) / C(G, k), c the problem's correct samples, the chance that k of its G
  samples drawn without replacement hold at least one correct one. pass@1 is avg@G; pass@G is
  the share of problems solved at least once. Exact integer binomials: no overflow for any G.

  Args:
    correct_MG: [M, G] bool, sample g of problem m correct.
    k: 1 <= k <= G.
  Returns: a float in [0, 1].
  """
  correct_MG = np.asarray(correct_MG, bool)
  _, g = correct_MG.shape
  if not 1 <= k <= g:
    raise ValueError(f'pass@{k} needs 1 <= k <= {g}, the samples per problem')
  total = math.comb(g, k)
  by_count = np.array([1.0 - math.comb(g - c, k) / total for c in range(g + 1)])
  return float(by_count[correct_MG.sum(-1)].mean())


def crn_hash(prompts, keys, *, batch_prompts, sampling):
  """CRC32 of what fixes an evaluation's random draws: the problems in order, the batch shape, the
  sampling settings and the sampler's keys (one per batch). Runs evaluated with common random
  numbers share it (experiments/verdicts.py checks it for every paired comparison)."""
  parts = [json.dumps([prompts, batch_prompts, sorted(sampling.items())]).encode()]
  parts += [np.asarray(jax.random.key_data(key)).tobytes() for key in keys]
  return zlib.crc32(b''.join(parts))


def sampling_se(correct_MG):
  """The standard error of avg@k that comes from sampling alone (the problems fixed): with
  p_n the chance that a sample of problem n is correct, Var(avg@k) = sum_n p_n (1 - p_n) /
  (k M^2) over the M problems, estimated without bias by p_hat (1 - p_hat) k / (k - 1) per problem (NaN for k = 1).
  A run evaluated again with other sampling keys moves by about this much."""
  n, k = correct_MG.shape
  if k < 2:
    return float('nan')
  p_M = correct_MG.mean(-1)
  return float(np.sqrt(np.sum(p_M * (1 - p_M) * k / (k - 1)) / (k * n * n)))
