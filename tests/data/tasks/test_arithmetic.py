"""Tests of jtc.data.tasks.arithmetic: every format of a solution is correct, named and rewarded;
lengths fit the character model; other text is no format."""
import re

import numpy as np
import pytest

from jtc.data import expressions
from jtc.data import tasks
from jtc.data.tasks import arithmetic

ARITH_CONFIGS = [
    {},
    {
        'ops': ('+', '-', '*'),
        'digits_a': 2,
        'digits_b': 2
    },
    {
        'ops': ('*',),
        'digits_a': 3,
        'digits_b': 1
    },
    {
        'ops': ('-',),
        'digits_a': 1,
        'digits_b': 3,
        'allow_negative': True
    },
    {
        'ops': ('+', '*'),
        'digits_a': 4,
        'digits_b': 3
    },
]


def _prompt_value(prompt):
  """Independent reading of 'What is a op b?' with python ints."""
  a, op, b = re.fullmatch(r'What is (\d+)([+\-*])(\d+)\?', prompt).groups()
  a, b = int(a), int(b)
  return {'+': a + b, '-': a - b, '*': a * b}[op]


@pytest.mark.parametrize('kwargs', ARITH_CONFIGS)
def test_arithmetic_every_format_is_correct_named_and_rewarded(kwargs):
  task = tasks.get_task('arithmetic', **kwargs)
  assert isinstance(task, tasks.Task)
  examples = task.examples('train', seed=3, num_examples=40)
  for ex in examples:
    value = _prompt_value(ex['prompt'])
    assert ex['answer'] == str(value)
    assert set(ex['solutions']) == set(task.formats)
    assert len(set(ex['solutions'].values())) == len(task.formats)  # formats never coincide
    for fmt, text in ex['solutions'].items():
      assert task.format_of(text) == fmt
      # every clause "x op y=z" of the text is true arithmetic
      for lhs, rhs in re.findall(r'(-?\d+[+\-*]\d+)=(-?\d+)', text):
        assert expressions.evaluate_expression(lhs) == int(rhs)
  prompts = [ex['prompt'] for ex in examples for _ in task.formats]
  completions = [ex['solutions'][f] for ex in examples for f in task.formats]
  answers = [ex['answer'] for ex in examples for _ in task.formats]
  r = task.reward_fn(prompts, completions, answers)
  assert r.dtype == np.float32 and r.shape == (len(completions),)
  np.testing.assert_array_equal(r, 1.0)
  wrong = [str(int(a) + 1) for a in answers]
  np.testing.assert_array_equal(task.reward_fn(prompts, completions, wrong), 0.0)


def test_arithmetic_default_lengths_fit_a_char_model():
  task = tasks.get_task('arithmetic', ops=('+', '-', '*'))
  for ex in task.examples('train', seed=0, num_examples=300):
    assert len(ex['prompt']) <= 16
    assert max(len(s) for s in ex['solutions'].values()) <= 40


def test_arithmetic_format_of_rejects_other_text():
  for text in ['81', 'The answer is', '23+58=', 'so 81.', '23+50=73,73+8=81.', 'hello', '']:
    assert arithmetic.format_of(text) is None
  # purely syntactic: a wrong answer keeps its format
  assert arithmetic.format_of('23+58=80.') == 'equation'
  assert arithmetic.format_of('  The answer is 7 ') == 'answer'
