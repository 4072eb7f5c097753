"""Tests of jtc.rl.evaluation: format shares, the sampling error of avg@k, unbiased pass@k against
its definition, and evaluation draws that depend on the evaluation's settings only."""

import jax
import numpy as np
import pytest

from jtc.data import tasks as tasks_lib
from jtc.models import bundles
from jtc.rl import evaluation
from jtc.rl import rollout


def _sampling(k):
  return dict(num_samples=k, max_new_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def test_format_metrics_are_shares_of_the_correct_completions():
  task = tasks_lib.get_task('arithmetic')
  texts = ['The answer is 81.', '23+58=81.', 'The answer is 7.', 'nonsense']
  out = evaluation.format_metrics(task, texts, np.array([True, True, True, False]))
  assert out['format/answer'] == pytest.approx(2 / 3)
  assert out['format/equation'] == pytest.approx(1 / 3) and out['format/steps'] == 0.0
  p = np.array([2 / 3, 1 / 3])
  assert out['format/entropy'] == pytest.approx(float(-(p * np.log(p)).sum()))
  assert evaluation.format_metrics(task, texts, np.zeros(4, bool)) == {}
  assert evaluation.format_metrics(None, texts, np.ones(4, bool)) == {}


@pytest.mark.slow  # repeated evaluations
def test_sampling_se_predicts_the_spread_of_repeated_evaluations():
  """avg@k_se, estimated from one evaluation's per-problem counts, against the standard
  deviation of avg@k over 40 evaluations of the same policy with other sampling keys."""
  bundle = bundles.load_policy_bundle('base')
  task = tasks_lib.get_task('arithmetic')
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=20)
  examples = task.examples('test', seed=0, num_examples=32)
  outs = [
      evaluation.evaluate(gen, bundle.params, examples, jax.random.key(r), sampling=_sampling(4),
                          batch_prompts=32)[0] for r in range(40)
  ]
  spread = np.std([o['avg@4'] for o in outs], ddof=1)
  se = np.mean([o['avg@4_se'] for o in outs])
  assert 0.01 < se < 0.1  # a non-degenerate policy: some problems neither always nor never solved
  assert 0.7 < spread / se < 1.4, (spread, se)
  np.testing.assert_allclose(evaluation.sampling_se(np.ones((5, 4), bool)), 0.0)
  assert np.isnan(evaluation.sampling_se(np.ones((5, 1), bool)))


def _evaluate_at_step_0(tmp_path, name, **overrides):
  from configs import gspo  # pylint: disable=import-outside-toplevel
  from jtc.rl import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  c = gspo.get_config('smoke')
  c.eval.problems, c.eval.batch_prompts = 6, 4
  for key, value in overrides.items():
    section, leaf = key.rsplit('.', 1)
    c[section][leaf] = value
  trainer = trainer_lib.Trainer(c, str(tmp_path / name))
  try:
    return trainer.evaluate(0)[0]
  finally:
    trainer.close()


def test_evaluation_draws_do_not_depend_on_the_training_batch(tmp_path):
  """Issue 38: the same policy evaluated under two rollout shapes (2 prompts x G = 4 and
  4 x G = 2) draws the same samples: equal accuracy, format shares and `crn`. A different
  config.eval.batch_prompts changes the draws and the hash (the known positive)."""
  a = _evaluate_at_step_0(tmp_path, 'a')
  b = _evaluate_at_step_0(tmp_path, 'b', **{
      'rollout.prompts_per_step': 4,
      'rollout.sampling.num_samples': 2
  })
  assert a.keys() == b.keys()
  assert a['eval/pass@1'] == pytest.approx(a['eval/avg@2']) and 'eval/pass@2' in a
  for k in a:
    assert k == 'time_eval' or a[k] == b[k], k
  c = _evaluate_at_step_0(tmp_path, 'c', **{'eval.batch_prompts': 3})
  assert c['eval/crn'] != a['eval/crn']
  assert any(c[k] != a[k] for k in a if k.startswith(('eval/avg', 'eval/format/')))


def test_pass_at_k_is_the_mean_over_every_k_subset_of_the_samples():
  """The estimator against its definition, by brute force: for each problem, the share of the
  C(G, k) subsets of its G samples that hold a correct one; pass@1 = avg@G, pass@G = solved
  at least once, and pass@k grows with k."""
  import itertools  # pylint: disable=import-outside-toplevel
  correct_MG = np.random.default_rng(0).random((7, 6)) < np.linspace(0.05, 0.9, 7)[:, None]
  correct_MG[0] = False  # a problem never solved
  correct_MG[-1] = True  # and one always solved
  for k in range(1, 7):
    brute = np.mean([
        np.mean([row[list(s)].any()
                 for s in itertools.combinations(range(6), k)])
        for row in correct_MG
    ])
    assert evaluation.pass_at_k(correct_MG, k) == pytest.approx(brute, abs=1e-12)
  assert evaluation.pass_at_k(correct_MG, 1) == pytest.approx(correct_MG.mean())
  assert evaluation.pass_at_k(correct_MG, 6) == pytest.approx(correct_MG.any(-1).mean())
  values = [evaluation.pass_at_k(correct_MG, k) for k in range(1, 7)]
  assert np.all(np.diff(values) > 0)
  with pytest.raises(ValueError, match=r'pass@7 needs 1 <= k <= 6'):
    evaluation.pass_at_k(correct_MG, 7)
  assert evaluation.pass_ks(16) == (1, 2, 4, 8, 16) and evaluation.pass_ks(6) == (1, 2, 4, 6)
  assert evaluation.pass_ks(1) == (1,)


def test_by_source_scores_each_sources_problems_alone():
  correct_MG = np.array([[1, 1], [0, 0], [1, 0], [0, 1]], bool)
  sources = ['gsm8k', 'gsm8k', 'math', '']
  out = evaluation.by_source(sources, correct_MG)
  assert out['gsm8k/avg@2'] == 0.5 and out['math/avg@2'] == 0.5 and out['(none)/avg@2'] == 0.5
  assert out['gsm8k/pass@2'] == 0.5 and out['math/pass@2'] == 1.0  # math's one problem, once
  assert out['math/pass@1'] == out['math/avg@2']
  assert evaluation.by_source(['', '', '', ''], correct_MG) == {}  # no source: nothing extra
