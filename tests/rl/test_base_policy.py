"""The policies shipped in jtc/assets (base_policy: arithmetic; phrasing_policy: the phrasing
task) load and score within their stated band.

Band (issue 4): held-out accuracy between 20% and 70% when sampling at temperature 1, so a
group of G samples holds both correct and incorrect answers, with every solution format present;
for the phrasing policy also every phrasing in use and equally accurate (issue 17).
"""

import jax
import numpy as np
import pytest

from configs import sft_arith
from configs import sft_phrasing
from jtc.analysis import probes
from jtc.models import bundles
from jtc.data import pipeline as data_lib
from jtc.rl import evaluation
from jtc.rl import rollout
from jtc.rl import sft_trainer as sft
from jtc.data import tasks as tasks_lib

SHIPPED = {'base': sft_arith, 'phrasing': sft_phrasing}


@pytest.fixture(scope='module', params=sorted(SHIPPED))
def base_eval(request, tmp_path_factory):
  """96 held-out problems x 4 samples at temperature 1 from a shipped policy."""
  bundle = bundles.load_policy_bundle(request.param)
  c = SHIPPED[request.param].get_config()
  task = tasks_lib.get_task(c.task)
  test = data_lib.load_examples(c.task, split='test', data_dir=str(tmp_path_factory.mktemp('data')),
                                limit=96)
  gen = rollout.Generator(model_config=bundle.model_config, tokenizer=bundle.tokenizer,
                          reward_fn=task.reward_fn, prompt_width=c.prompt_width)
  texts, correct = [], []
  for s in range(0, len(test), 32):
    chunk = test[s:s + 32]
    ro, = rollout.generate(gen, bundle.params,
                           [[e['prompt'] for e in chunk]], [[e['answer'] for e in chunk]],
                           jax.random.fold_in(jax.random.key(123), s),
                           sft.eval_sampling(4, c.max_new_tokens))
    texts += ro.texts
    correct += list(ro.correct_B)
  correct = np.array(correct)
  result = {'avg@4': float(correct.mean()), **evaluation.format_metrics(task, texts, correct)}
  return bundle, task, result, texts, correct


def test_base_policy_accuracy_in_band(base_eval):
  """Groups of G samples hold both correct and incorrect answers."""
  result = base_eval[2]
  assert 0.2 <= result['avg@4'] <= 0.7, result


def test_base_policy_writes_every_format(base_eval):
  _, task, result, _, _ = base_eval
  for f in task.formats:
    assert result[f'format/{f}'] > (0.2 if task.name == 'phrasing' else 0.05), result


def test_phrasings_are_equally_easy_for_the_phrasing_policy(base_eval):
  """The premise of the drift experiment: on the phrasing task the base policy's accuracy does
  not depend on the phrasing it writes (chi-square test of independence, and every pair of
  Wilson intervals overlaps)."""
  _, task, _, texts, correct = base_eval
  if task.name != 'phrasing':
    pytest.skip('the arithmetic formats differ in reasoning and in accuracy by design')
  per_format, p = probes.format_accuracy(task, texts, correct)
  assert p > 0.05, per_format
  intervals = [ci for _, _, _, ci in per_format.values()]
  assert max(lo for lo, _ in intervals) < min(hi for _, hi in intervals), per_format


def test_stated_accuracy_matches_a_fresh_measurement(base_eval):
  bundle, _, result, _, _ = base_eval
  stated = bundle.meta['eval']['avg@4']
  # 96 problems x 4 samples here vs 256 x 4 at build time: allow ~4 standard errors.
  assert abs(result['avg@4'] - stated) < 0.15, (result, stated)
