"""Tests of jtc.data.tasks.base: train and test splits are disjoint, deterministic and independent
of the seed; too few problems is a clear error."""
import re

import pytest

from jtc.data import tasks


@pytest.mark.parametrize('name, kwargs', [('arithmetic', {}), ('arithmetic', {
    'ops': ('+',)
}), ('countdown', {})])
def test_splits_are_disjoint_deterministic_and_seed_independent(name, kwargs):
  task = tasks.get_task(name, **kwargs)
  key = lambda ex: task_key(task, ex)  # noqa: E731
  train0 = task.examples('train', seed=0, num_examples=400)
  train1 = task.examples('train', seed=1, num_examples=400)
  test0 = task.examples('test', seed=0, num_examples=40)
  test1 = task.examples('test', seed=1, num_examples=40)
  assert train0 == task.examples('train', seed=0, num_examples=400)
  assert [e['prompt'] for e in train0] != [e['prompt'] for e in train1]
  train_keys = {key(e) for e in train0 + train1}
  test_keys = {key(e) for e in test0 + test1}
  assert len({key(e) for e in train0}) == 400  # distinct within a split
  assert not train_keys & test_keys


def task_key(task, ex):
  """Canonical problem identity computed from the prompt text, independently of the task code."""
  if task.name == 'arithmetic':
    a, op, b = re.fullmatch(r'What is (\d+)([+\-*])(\d+)\?', ex['prompt']).groups()
    return (op, *sorted((int(a), int(b)))) if op in '+*' else (op, int(a), int(b))
  target, nums = re.fullmatch(r'Make (\d+) from ([\d,]+)\.', ex['prompt']).groups()
  return int(target), tuple(sorted(int(n) for n in nums.split(',')))


def test_too_few_problems_is_a_clear_error():
  task = tasks.get_task('arithmetic', digits_a=1, digits_b=1, ops=('+',))
  with pytest.raises(ValueError, match='distinct problems'):
    task.examples('test', seed=0, num_examples=50)
  with pytest.raises(ValueError, match='split'):
    task.examples('validation', seed=0, num_examples=5)
