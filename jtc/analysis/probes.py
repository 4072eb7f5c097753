"""Offline analysis of a policy: KL drift at a context and drift between equivalent solutions.

For notebooks and experiments, not the training loop (the per-step diagnostics are in
`jtc.analysis.diagnostics`; curve statistics in `jtc.analysis.curves`). Cited "Eq. N" from paper 2604.13088:

  fisher_quadratic / kl_drift / kl_drift_at_context    Prop. 3.1, Eq. 3: measured
      KL(pi_{theta + eta g} || pi_theta) at a context against 1/2 eta^2 g^T F g.
  solution_logprobs / format_log_odds / format_distribution / format_entropy / format_probe
      Cor. 3.2 (Eq. 5) and App. A (Eq. 41): log-probabilities of equivalent solution texts and
      the policy restricted to that equivalent set, exactly (no sampling).
  format_accuracy          are the equivalent forms equally easy? accuracy per form of sampled
                           completions, Wilson intervals and a chi-square test.

Dimension key (docs/dimensions.md): V vocab, M problems, A equivalent answer formats, P prompt
width, T completion length, L = P + T.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jtc.data import pipeline as data_lib
from jtc.models import model as model_lib
from jtc.models import logprobs

# ---------------------------------------------------------------------------------------------
# KL drift at a context (Prop. 3.1, Eq. 3).
# ---------------------------------------------------------------------------------------------


def fisher_quadratic(logp_fn, params, direction):
  """g^T F(h) g with F(h) = E_{y ~ pi(.|h)}[grad log pi(y|h) grad log pi(y|h)^T] (Prop. 3.1).

  Written as E_y[(grad log pi(y|h) . g)^2] = sum_y pi(y|h) (J g)_y^2, J g from one JVP of the
  [V] log-prob vector, so F is never formed.

  Args:
    logp_fn: params -> [V] log pi_theta(. | h) at the context.
    params, direction: pytrees of the same structure (g).
  """
  logp_V, dlogp_V = jax.jvp(logp_fn, (params,), (direction,))
  return jnp.sum(jnp.exp(logp_V) * jnp.square(dlogp_V))


def _kl(logp_a_V, logp_b_V):
  return jnp.sum(jnp.exp(logp_a_V) * (logp_a_V - logp_b_V))


def kl_drift(logp_fn, params, direction, *, step_size):
  """Measured KL(pi_{theta + eta g} || pi_theta) at a context vs 1/2 eta^2 g^T F g (Eq. 3).

  Returns dict(kl, predicted, gFg, ratio = kl / predicted); ratio -> 1 as eta -> 0, the gap is
  O(eta^3 ||g||^3).
  """
  logp_V = logp_fn(params)
  moved = jax.tree.map(lambda p, g: p + step_size * g, params, direction)
  kl = _kl(logp_fn(moved), logp_V)
  gfg = fisher_quadratic(logp_fn, params, direction)
  predicted = 0.5 * step_size**2 * gfg
  return {
      'kl': kl,
      'predicted': predicted,
      'gFg': gfg,
      'ratio': kl / jnp.where(predicted > 0, predicted, 1.0)
  }


def context_logprobs_fn(config, tokens_L, input_mask_L, *, position):
  """params -> [V] log pi(. | tokens[:position]): the next-token distribution at the context
  made of the (left-padded) first ``position`` columns."""
  L = tokens_L.shape[0]
  if not 1 <= position < L + 1:
    raise ValueError(f'position={position!r} must be in [1, {L}]')

  def fn(params):
    toks = tokens_L[None, :position]
    m = jnp.asarray(input_mask_L)[None, :position]
    out = model_lib.forward(params, config, toks, model_lib.positions_from_mask(m), m)
    return jax.nn.log_softmax(out.logits_BLV[0, -1].astype(jnp.float32))

  return fn


def kl_drift_at_context(params, config, tokens_L, input_mask_L, *, position, direction, step_size):
  """`kl_drift` for the model's next-token distribution after ``tokens_L[:position]``."""
  fn = context_logprobs_fn(config, tokens_L, input_mask_L, position=position)
  return kl_drift(fn, params, direction, step_size=step_size)


# ---------------------------------------------------------------------------------------------
# Drift between equivalent solutions (Cor. 3.2, Eq. 5; App. A Eq. 41).
# ---------------------------------------------------------------------------------------------


def completion_logprobs(params, config, tokenizer, prompts, completions, *, prompt_width,
                        width=None, append_eos=True, chat_template=True):
  """Per-token log pi(y_t | x, y_<t) of given completion texts, one forward pass for all.

  ``completions[n]`` are the A texts scored after ``prompts[n]``; prompts go through
  `data.encode_prompts` (chat template unless ``chat_template=False``, bos, left padding to
  ``prompt_width``) as in training (append a run's ``data.prompt_suffix`` to the prompts);
  completions are right-padded to ``width`` (default: the longest), with EOS appended when
  ``append_eos``. Returns (logps_MAT, mask_MAT) as numpy arrays.
  """
  A = len(completions[0])
  if not prompts or any(len(c) != A for c in completions) or A == 0:
    raise ValueError('need one non-empty list of completions per prompt, the same number for all')
  ids = [[tokenizer.encode(c) + ([tokenizer.eos_id] if append_eos else [])
          for c in cs]
         for cs in completions]
  T = width or max(len(x) for cs in ids for x in cs)
  if max(len(x) for cs in ids for x in cs) > T:
    raise ValueError(f'a completion is longer than width={T} tokens')
  tok_MP, mask_MP = data_lib.encode_prompts(tokenizer, prompts, width=prompt_width,
                                            chat_template=chat_template)
  M = len(prompts)
  comp_MAT = np.full((M, A, T), tokenizer.pad_id, np.int32)
  cmask_MAT = np.zeros((M, A, T), np.int32)
  for n, cs in enumerate(ids):
    for f, x in enumerate(cs):
      comp_MAT[n, f, :len(x)] = x
      cmask_MAT[n, f, :len(x)] = 1
  tokens = np.concatenate([np.repeat(tok_MP, A, 0), comp_MAT.reshape(M * A, T)], axis=1)
  inmask = np.concatenate([np.repeat(mask_MP, A, 0), cmask_MAT.reshape(M * A, T)], axis=1)
  logps = _sequence_logprobs_jit(params, config, jnp.asarray(tokens), jnp.asarray(inmask),
                                 completion_start=prompt_width)['logps']
  return np.asarray(logps).reshape(M, A, T) * cmask_MAT, cmask_MAT


def solution_logprobs(params, config, tokenizer, prompt, completions, *, append_eos=True,
                      prompt_width=None):
  """log pi(y | x) = sum_t log pi(y_t | x, y_<t) of each completion text of one prompt. [A]."""
  completions = list(completions)
  if not completions:
    raise ValueError('completions must not be empty')
  if prompt_width is None:
    prompt_width = len(data_lib.prompt_ids(tokenizer, prompt))
  logps_MAT, _ = completion_logprobs(params, config, tokenizer, [prompt], [completions],
                                     prompt_width=prompt_width, append_eos=append_eos)
  return jnp.asarray(logps_MAT[0].sum(-1))


def format_probe(params, config, tokenizer, examples, formats, *, prompt_width, width=None,
                 scaffold='', chat_template=True, prompt_suffix=''):
  """The policy restricted to each problem's equivalent correct solutions (Cor. 3.2, Eq. 41),
  measured exactly (no sampling) on fixed ``examples`` ({'prompt', 'solutions': {format: text}}).

  Returns floats: 'format_entropy' (mean over problems of the entropy, nats, of
  q_f = pi(y_f | x) / sum_f' pi(y_f' | x); log A for A equally likely forms),
  'format_logq/<f>' (mean log q_f: drift towards or away from form f),
  'ending_logprob/<f>' (mean log pi(the tokens every form ends with | x, form f before them),
  EOS included: on the phrasing task the answer after the phrasing; equal across f when no
  form makes the shared ending, hence the reward, more or less likely) and, with a
  ``scaffold`` every solution starts with, 'scaffold_logprob' (mean log pi(scaffold | x): the
  shared tokens' probability, whose change over training is the learning tax on them).
  Prompts are encoded as in training (``chat_template``, ``prompt_suffix``).
  """
  texts = [[e['solutions'][f] for f in formats] for e in examples]
  logps_MAT, mask_MAT = completion_logprobs(params, config, tokenizer,
                                            [e['prompt'] + prompt_suffix for e in examples], texts,
                                            prompt_width=prompt_width, width=width,
                                            chat_template=chat_template)
  x_MA = logps_MAT.sum(-1).astype(np.float64)
  x_MA = x_MA - x_MA.max(-1, keepdims=True)
  q_MA = x_MA - np.log(np.exp(x_MA).sum(-1, keepdims=True))  # log q_f
  out = {'format_entropy': float(np.mean(-(np.exp(q_MA) * q_MA).sum(-1)))}
  out.update({f'format_logq/{f}': float(q_MA[:, i].mean()) for i, f in enumerate(formats)})
  ending_MA = np.zeros(q_MA.shape)
  for n, ts in enumerate(texts):
    k = _common_suffix_len([tokenizer.encode(t) for t in ts]) + 1  # + 1: the EOS
    ends_A = mask_MAT[n].sum(-1)
    ending_MA[n] = [logps_MAT[n, f, e - k:e].sum() for f, e in enumerate(ends_A)]
  out.update({f'ending_logprob/{f}': float(ending_MA[:, i].mean()) for i, f in enumerate(formats)})
  if scaffold:
    n = len(tokenizer.encode(scaffold))
    out['scaffold_logprob'] = float(logps_MAT[:, 0, :n].sum(-1).mean())
  return out


def _common_suffix_len(token_lists):
  """How many final tokens all the token lists share."""
  k = 0
  while k < min(map(len, token_lists)) and len({t[len(t) - 1 - k] for t in token_lists}) == 1:
    k += 1
  return k


_sequence_logprobs_jit = jax.jit(logprobs.sequence_logprobs, static_argnums=1,
                                 static_argnames=('completion_start',))


def format_log_odds(logp_a, logp_b):
  """log pi(y_a | x) - log pi(y_b | x) for two equal-reward surface forms (Eq. 5 / Eq. 41)."""
  return jnp.asarray(logp_a, jnp.float32) - jnp.asarray(logp_b, jnp.float32)


def format_distribution(logps_A):
  """q_f = pi(y_f | x) / sum_f' pi(y_f' | x): the policy restricted to the equivalent set."""
  chex.assert_rank(logps_A, 1)
  return jax.nn.softmax(jnp.asarray(logps_A, jnp.float32))


def format_entropy(logps_A):
  """Entropy (nats) of `format_distribution`: log A for A equally likely forms, -> 0 under
  the entropy-collapse trend of Cor. 3.2 (the binary entropy h(p_k) for F = 2)."""
  q_A = format_distribution(logps_A)
  return -jnp.sum(jnp.where(q_A > 0, q_A * jnp.log(jnp.where(q_A > 0, q_A, 1.0)), 0.0))


def wilson_interval(k, n, z=1.96):
  """95% Wilson score interval of a proportion k / n ((nan, nan) for n = 0)."""
  if n == 0:
    return float('nan'), float('nan')
  p = k / n
  den = 1 + z * z / n
  mid = (p + z * z / (2 * n)) / den
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
  return float(mid - half), float(mid + half)


def chi2_sf(x, df):
  """P(X >= x) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, x/2),
  by its series (exact to float precision for the small df of a contingency table)."""
  if x <= 0:
    return 1.0
  a, h = df / 2.0, x / 2.0
  term = total = 1.0 / a
  for k in range(1, 10_000):
    term *= h / (a + k)
    total += term
    if term < 1e-16 * total:
      break
  return float(max(0.0, 1.0 - np.exp(a * np.log(h) - h - math.lgamma(a)) * total))


def format_accuracy(task, texts, correct_B):
  """Accuracy of the samples written in each equivalent form: {format: (n, correct, rate,
  Wilson 95% CI)}, and the chi-square test of independence of form and correctness (p-value;
  a small p says the forms are not equally easy). Samples of no form are left out."""
  names = [task.format_of(t) for t in texts]
  table = np.array(
      [[sum(1
            for n, ok in zip(names, correct_B)
            if n == f and ok == c)
        for c in (True, False)]
       for f in task.formats], np.float64)
  out = {}
  for f, (k, miss) in zip(task.formats, table):
    n = k + miss
    out[f] = (int(n), int(k), k / n if n else float('nan'), wilson_interval(k, n))
  used = table[table.sum(1) > 0]
  expected = used.sum(1, keepdims=True) * used.sum(0, keepdims=True) / used.sum()
  ok = expected > 0
  stat = float((((used - expected)**2)[ok] / expected[ok]).sum())
  return out, chi2_sf(stat, (used.shape[0] - 1) * (used.shape[1] - 1))
