"""Tests for jtc.data.tasks: formats, verifiers, splits."""
import re

import numpy as np
import pytest

from jtc.data import expressions
from jtc.data import tasks
from jtc.data.tasks import arithmetic, countdown

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


def test_get_task_unknown_lists_known():
  with pytest.raises(ValueError, match=r"'nope'.*arithmetic.*countdown"):
    tasks.get_task('nope')
  with pytest.raises(ValueError, match='ops'):
    tasks.get_task('arithmetic', ops=('/',))


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


def test_phrasing_solutions_share_reasoning_scaffold_and_length():
  """The equivalent forms differ only in an equally long phrasing after identical reasoning,
  all score 1, and format_of names each; a wrong number scores 0 in any phrasing."""
  from jtc.data.tasks import phrasing  # pylint: disable=import-outside-toplevel
  task = tasks.get_task('phrasing')
  for e in task.examples('train', seed=3, num_examples=50):
    sols = e['solutions']
    assert set(sols) == set(phrasing.FORMATS)
    assert len({len(s) for s in sols.values()}) == 1
    prefixes = {s[:s.index('. ') + 2] for s in sols.values()}
    assert len(prefixes) == 1 and prefixes.pop().startswith(phrasing.SCAFFOLD)
    for f, s in sols.items():
      assert task.format_of(s) == f
      assert task.reward_fn([e['prompt']], [s], [e['answer']])[0] == 1.0
      wrong = s[:s.rindex(' ') + 1] + str(int(e['answer']) + 1) + '.'
      assert task.reward_fn([e['prompt']], [wrong], [e['answer']])[0] == 0.0
      assert task.format_of(wrong) == f
  assert task.format_of('The answer is 5.') is None
