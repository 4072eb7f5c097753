"""Tests of jtc.data.tasks.countdown: solutions verify, the verifier's rules, minimal parentheses,
the answer codec."""
import re

import numpy as np
import pytest

from jtc.data import expressions
from jtc.data import tasks
from jtc.data.tasks import countdown


@pytest.mark.parametrize('kwargs', [{}, {'num_numbers': 4, 'max_number': 25, 'max_target': 200}])
def test_countdown_solutions_verify(kwargs):
  task = tasks.get_task('countdown', **kwargs)
  examples = task.examples('train', seed=0, num_examples=60)
  for ex in examples:
    target, numbers = countdown.decode_answer(ex['answer'])
    assert ex['prompt'] == f'Make {target} from ' + ','.join(map(str, numbers)) + '.'
    assert 1 <= target <= task.max_target and len(numbers) == task.num_numbers
    for fmt, text in ex['solutions'].items():
      assert task.format_of(text) == fmt
      # the solution uses every number exactly once (independent count of its literals)
      assert sorted(int(x) for x in re.findall(r'\d+', text.split('=')[0])) == sorted(numbers)
  completions = [ex['solutions'][f] for ex in examples for f in task.formats]
  answers = [ex['answer'] for ex in examples for _ in task.formats]
  np.testing.assert_array_equal(task.reward_fn([''] * len(answers), completions, answers), 1.0)
  strict = tasks.get_task('countdown', require_all=True, **kwargs)
  np.testing.assert_array_equal(strict.reward_fn([''] * len(answers), completions, answers), 1.0)


@pytest.mark.parametrize(
    'completion, ok',
    [
        ('(8-4)*6.', True),
        ('8*6/(4-2)=24.', False),  # 2 not given
        ('6*4.', True),  # subset allowed
        ('6*4*1=24', False),  # 1 not given
        ('6*4=25.', False),  # stated value wrong
        ('6*4=abc', False),
        ('6*4*(6/6)', False),  # 6 used three times
        ('8/(4-4)', False),
        ('-8+32', False),  # unary sign / unknown number
        ('2**3*3', False),
        ('48/2', False),
        ('', False),
        ('24', False),  # 24 not given
        ("eval('24')", False),
    ],
)
def test_countdown_verifier_rules(completion, ok):
  assert countdown.verify(completion, 24, [8, 4, 6]) is ok


def test_countdown_require_all_and_fractions():
  assert countdown.verify('6*4', 24, [6, 4, 1]) is True
  assert countdown.verify('6*4', 24, [6, 4, 1], require_all=True) is False
  assert countdown.verify('6*4*1', 24, [6, 4, 1], require_all=True) is True
  # exact fractions: 8/(3-8/3) = 24 needs a non-integer intermediate value
  assert countdown.verify('8/(3-8/3)', 24, [8, 3, 8, 3]) is True


def test_countdown_minimal_parentheses_keep_the_value():
  rng = np.random.default_rng(0)
  for _ in range(200):

    def build(depth):
      if depth == 0 or rng.random() < 0.3:
        return int(rng.integers(1, 9))
      return ('+-*/'[int(rng.integers(4))], build(depth - 1), build(depth - 1))

    def full(node):
      return str(node) if isinstance(node, int) else f'({full(node[1])}{node[0]}{full(node[2])})'

    node = build(4)
    try:
      want = expressions.evaluate_expression(full(node))
    except expressions.ExpressionError:
      continue
    text = countdown._to_text(node)
    assert expressions.evaluate_expression(text) == want
    assert text.count('(') <= full(node).count('(')


def test_countdown_answer_codec():
  assert countdown.decode_answer(countdown.encode_answer(24, [1, 2, 3])) == (24, (1, 2, 3))
  with pytest.raises(ValueError, match='malformed countdown answer'):
    countdown.decode_answer('24')
  assert countdown.CountdownTask().format_of('what') is None
