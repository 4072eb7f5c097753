"""Tests of jtc.analysis.probes: the Fisher quadratic and KL drift (Prop. 3.1), solution log-probs
and format log-odds (Cor. 3.2) against closed forms and plain loops."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import probes
from jtc.models import model
from jtc.models import tokenizer as tokenizer_lib


def _cfg(**kw):
  return model.ModelConfig.tiny(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                head_dim=16, d_ff=64, **kw)


def test_kl_drift_tabular_softmax_second_order():
  theta = jnp.array([0.3, -1.0, 0.8, 0.0, 0.5])
  g = jnp.array([1.0, 0.5, -2.0, 0.3, 0.0])
  fn = jax.nn.log_softmax
  p = np.asarray(jax.nn.softmax(theta), np.float64)
  gn = np.asarray(g, np.float64)
  # F = diag(p) - p p^T for a softmax over free logits.
  closed = np.sum(p * gn**2) - np.sum(p * gn)**2
  np.testing.assert_allclose(probes.fisher_quadratic(fn, theta, g), closed, rtol=1e-5)
  gaps = []
  for eta in (0.3, 0.1, 0.03):
    out = probes.kl_drift(fn, theta, g, step_size=eta)
    gaps.append(abs(float(out['ratio']) - 1.0))
  assert gaps[0] > gaps[1] > gaps[2]
  assert gaps[2] < 0.03


def test_kl_drift_at_context_tiny_transformer():
  cfg = _cfg()
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 16, size=(9,)), jnp.int32)
  inm = jnp.ones((9,), jnp.int32).at[0].set(0)
  g = jax.tree.map(lambda x: jax.random.normal(jax.random.key(2), x.shape) / np.sqrt(x.size),
                   params)
  fn = jax.jit(lambda p, d: probes.kl_drift_at_context(p, cfg, tokens, inm, position=4, direction=d,
                                                       step_size=0.02))
  out = fn(params, g)
  assert float(out['kl']) > 0
  assert float(out['ratio']) == pytest.approx(1.0, abs=0.05)


def test_format_log_odds_matches_manual_logprobs():
  tok = tokenizer_lib.CharTokenizer()
  cfg = _cfg().__class__.tiny(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2,
                              n_kv_heads=1, head_dim=16, d_ff=64)
  params = model.init_params(cfg, jax.random.key(6))
  sols = ['The answer is 20.', '10+10=20.']
  forward_fn = jax.jit(lambda p, x: model.forward(
      p, cfg, x, model.positions_from_mask(jnp.ones_like(x)), jnp.ones_like(x)).logits_BLV)
  lp = probes.solution_logprobs(params, cfg, tok, 'What is 10+10?', sols)

  def manual(text):  # full logits, no padding, plain log-softmax loop
    prompt = [tok.bos_id] + tok.encode(tok.apply_chat_template('What is 10+10?'))
    ids = prompt + tok.encode(text) + [tok.eos_id]
    x = jnp.asarray([ids], jnp.int32)
    logits = forward_fn(params, x)
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    return sum(float(logp[i - 1, ids[i]]) for i in range(len(prompt), len(ids)))

  np.testing.assert_allclose(probes.format_log_odds(lp[0], lp[1]),
                             manual(sols[0]) - manual(sols[1]), rtol=1e-4, atol=1e-3)
  assert float(probes.format_entropy(jnp.array([-1.0, -1.0]))) == pytest.approx(math.log(2))
  assert float(probes.format_entropy(jnp.array([0.0, -80.0]))) == pytest.approx(0.0, abs=1e-6)


def test_format_probe_matches_per_problem_solution_logprobs():
  """format_probe = softmax over the F full solutions' log-probs (computed one problem at a
  time with solution_logprobs), its entropy, log-shares and the scaffold's log-prob."""
  from jtc.data import tasks  # pylint: disable=import-outside-toplevel
  tok = tokenizer_lib.CharTokenizer()
  cfg = _cfg().__class__.tiny(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2,
                              n_kv_heads=1, head_dim=16, d_ff=64)
  params = model.init_params(cfg, jax.random.key(7))
  task = tasks.get_task('phrasing')
  examples = task.examples('test', seed=0, num_examples=3)
  out = probes.format_probe(params, cfg, tok, examples, task.formats, prompt_width=20,
                            scaffold=task.scaffold)
  ents, logq = [], []
  for e in examples:
    lp = np.asarray(
        probes.solution_logprobs(params, cfg, tok, e['prompt'],
                                 [e['solutions'][f] for f in task.formats], prompt_width=20),
        np.float64)
    q = lp - lp.max() - np.log(np.exp(lp - lp.max()).sum())
    ents.append(-(np.exp(q) * q).sum())
    logq.append(q)
  np.testing.assert_allclose(out['format_entropy'], np.mean(ents), rtol=1e-4)
  for i, f in enumerate(task.formats):
    np.testing.assert_allclose(out[f'format_logq/{f}'], np.mean([q[i] for q in logq]), rtol=1e-4)
  assert 0 < out['format_entropy'] <= math.log(3) + 1e-9
  # The scaffold is the common prefix: its log-prob is that of the prefix of any solution.
  prefix = [
      probes.solution_logprobs(params, cfg, tok, e['prompt'], [task.scaffold], append_eos=False,
                               prompt_width=20) for e in examples
  ]
  np.testing.assert_allclose(out['scaffold_logprob'], np.mean([float(p[0]) for p in prefix]),
                             rtol=1e-4)
  # The shared ending (' <answer>.' and EOS) after each phrasing: the log-prob of the whole
  # solution minus that of the solution without it.
  endings = []
  for e in examples:
    ending = f' {e["answer"]}.'
    texts = [e['solutions'][f] for f in task.formats]
    assert all(t.endswith(ending) for t in texts)
    full = probes.solution_logprobs(params, cfg, tok, e['prompt'], texts, prompt_width=20)
    head = probes.solution_logprobs(params, cfg, tok, e['prompt'],
                                    [t[:-len(ending)] for t in texts], append_eos=False,
                                    prompt_width=20)
    endings.append(np.asarray(full - head, np.float64))
  got = np.array([out[f'ending_logprob/{f}'] for f in task.formats])
  np.testing.assert_allclose(got, np.mean(endings, 0), rtol=1e-4, atol=1e-5)
  assert np.ptp(got) > 1e-3  # a random policy continues differently after each phrasing


def test_chi2_sf_and_wilson_interval_closed_forms():
  for x in (0.5, 2.0, 7.3):
    assert probes.chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)  # df = 2
    assert probes.chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
  assert probes.chi2_sf(0.0, 3) == 1.0
  lo, hi = probes.wilson_interval(50, 100)
  assert (lo + hi) / 2 == pytest.approx(0.5) and hi - lo == pytest.approx(0.1924, abs=1e-3)


def test_format_accuracy_detects_unequal_forms_and_not_equal_ones():
  """Known-positive and -negative controls: forms with 90% vs 50% accuracy give a tiny p;
  forms with equal accuracy do not."""
  from jtc.data import tasks  # pylint: disable=import-outside-toplevel
  task = tasks.get_task('phrasing')
  sols = task.examples('test', seed=0, num_examples=1)[0]['solutions']
  rng = np.random.default_rng(0)
  texts = [sols[f] for f in task.formats for _ in range(200)]
  unequal = np.concatenate([rng.uniform(size=200) < p for p in (0.9, 0.5, 0.5)])
  equal = rng.uniform(size=600) < 0.6
  out, p_unequal = probes.format_accuracy(task, texts, unequal)
  assert out['answer'][0] == 200 and out['answer'][2] > 0.8 and p_unequal < 1e-6
  _, p_equal = probes.format_accuracy(task, texts, equal)
  assert p_equal > 0.01
