"""Tests for jtc.data.rewards: answer extraction, exact equivalence of numbers and forms, the
verifiers, fuzzing (no verifier crashes or hangs)."""
from fractions import Fraction

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from jtc.data import expressions
from jtc.data import rewards

FUZZ = hypothesis.settings(max_examples=150, deadline=1000, derandomize=True)


@FUZZ
@hypothesis.given(st.integers(-10**6, 10**6), st.integers(1, 10**4))
def test_fraction_forms_parse_to_the_same_value(p, q):
  want = Fraction(p, q)
  assert rewards.parse_number(f'{p}/{q}') == want
  sign = '-' if p < 0 else ''
  assert rewards.parse_number(f'{sign}\\frac{{{abs(p)}}}{{{q}}}') == want
  assert rewards.parse_number(f'${p}/{q}$.') == want


@FUZZ
@hypothesis.given(st.integers(-10**9, 10**9), st.integers(0, 6))
def test_decimal_and_comma_forms(n, places):
  # n / 10**places written as a decimal string by hand.
  digits = str(abs(n)).rjust(places + 1, '0')
  text = ('-' if n < 0 else '') + (digits[:-places] + '.' + digits[-places:] if places else digits)
  assert rewards.parse_number(text) == Fraction(n, 10**places)
  assert rewards.parse_number(f'{n:,}') == Fraction(n)
  assert rewards.numbers_equal(f'{n}', f'{n}.000')


@pytest.mark.parametrize('text', ['', 'abc', '1/0', '1e5', '--3', '3..4', '1' * 100, '1,23', None])
def test_parse_number_rejects(text):
  assert rewards.parse_number(text) is None


@pytest.mark.parametrize(
    'text, want',
    [
        ('so \\boxed{\\frac{1}{2}} and more', '\\frac{1}{2}'),
        ('\\boxed{1} then \\boxed{{2}+{3}}', '{2}+{3}'),  # last box, nested braces
        ('\\boxed{7} \\boxed{unclosed', '7'),  # the unbalanced last box is skipped
        ('The answer is 81.', '81'),
        ('answer is 3 but the answer is -12.5.', '-12.5'),
        ('The answer is forty-two.', 'forty-two'),
        ('compute 12+30\n#### 1,234', '1,234'),
        ('23+50=73,73+8=81,so 81.', '81'),
        ('10-3', '3'),
        ('x=-7', '-7'),
        ('no digits here', None),
        ('', None),
    ],
)
def test_extract_answer(text, want):
  assert rewards.extract_answer(text) == want


def test_rule_order_boxed_beats_answer_is_beats_last_number():
  text = 'The answer is 5. \\boxed{6} 7'
  assert rewards.extract_answer(text) == '6'
  assert rewards.extract_answer('The answer is 5. 7') == '5'


def test_reward_interface_and_equal_reward_across_forms():
  completions = [
      'The answer is 0.5.', '\\boxed{\\frac{1}{2}}', '1/2', '2/4', 'The answer is 1/3.', 'none'
  ]
  r = rewards.numeric_match([''] * 6, completions, ['0.5'] * 6)
  assert r.dtype == np.float32 and r.shape == (6,)
  np.testing.assert_array_equal(r, [1, 1, 1, 1, 0, 0])
  exact = rewards.exact_match([''] * 6, completions, ['1/2'] * 6)
  np.testing.assert_array_equal(exact, [0, 0, 1, 0, 0, 0])
  fmt = rewards.format_reward([''] * 6, completions, ['0.5'] * 6)
  np.testing.assert_array_equal(fmt, [1, 1, 0, 0, 1, 0])


def test_expression_match_and_combine():
  r = rewards.get_reward_fn('expression_match')(['', '', ''], ['3*(4+4)=24.', '3*4+4', '1/0'],
                                                ['24'] * 3)
  np.testing.assert_array_equal(r, [1, 0, 0])
  both = rewards.combine((1.0, rewards.numeric_match), (0.5, rewards.format_reward))
  np.testing.assert_allclose(both(['', ''], ['The answer is 2.', '2'], ['2', '2']), [1.5, 1.0])


def test_bad_inputs():
  with pytest.raises(ValueError, match='equal length'):
    rewards.numeric_match(['a'], ['b', 'c'], ['1'])
  with pytest.raises(ValueError, match='valid:.*numeric_match'):
    rewards.get_reward_fn('nope')
  assert rewards.get_reward_fn('numeric_match')([], [], []).shape == (0,)


_NASTY = st.lists(
    st.sampled_from(
        list('0123456789+-*/^().,=$ {}\\#x×÷%_\u2212\u2013\uff0d') + [
            '\\boxed{', '\\frac', '\\dfrac', 'answer is ', '**', '####', '\\text{', '\\mbox{ cm}',
            '\\%', '\\$', '\\,', '^\\circ', '^{\\circ}', 'x = ', 'n_1='
        ]),
    max_size=150,
).map(''.join)


@FUZZ
@hypothesis.given(st.one_of(st.text(max_size=300), _NASTY), st.one_of(st.text(max_size=20), _NASTY))
def test_fuzz_no_verifier_crashes_or_hangs(completion, answer):
  rewards.extract_answer(completion)
  rewards.parse_number(completion)
  try:
    expressions.parse_expression(completion)
  except expressions.ExpressionError:
    pass
  for fn in rewards.REWARD_FNS.values():
    r = fn(['p'], [completion], [answer])
    assert r.shape == (1,) and r[0] in (0.0, 1.0)


def test_boxed_numeric_reward():
  completions = [
      'so \\boxed{3}', '\\boxed{1/2} hmm \\boxed{0.5}', 'the answer is 3', '\\boxed{\\frac{1}{2}}',
      '\\boxed{x+1}', '\\boxed{3.0}'
  ]
  answers = ['3', '0.5', '3', 'x', 'x+1', '3']
  got = rewards.boxed_numeric([''] * 6, completions, answers)
  # The last box counts; an unboxed answer scores 0; non-numeric answers compare as strings.
  np.testing.assert_array_equal(got, [1, 1, 0, 0, 1, 1])
  with pytest.raises(ValueError, match='equal length'):
    rewards.boxed_numeric([''], ['a', 'b'], ['1', '2'])


@pytest.mark.parametrize('dash',
                         ['\u2212', '\u2012', '\u2013', '\u2014', '\u2015', '\ufe63', '\uff0d'])
def test_unicode_minus_is_a_minus_sign(dash):
  text = f'so the result is {dash}5'
  assert rewards.extract_answer(text) == '-5'
  np.testing.assert_array_equal(rewards.numeric_match(['', ''], [text, text], ['-5', '5']), [1, 0])
  assert rewards.parse_number(f'\\boxed{{{dash}5}}'[7:-1]) == -5
  assert rewards.parse_number(f'{dash}\\frac{{3}}{{4}}') == Fraction(-3, 4)
  assert rewards.boxed_numeric([''], [f'\\boxed{{{dash}5}}'], ['5'])[0] == 0
  assert rewards.exact_match([''], [f'\\boxed{{{dash}5}}'], ['-5'])[0] == 1
  assert rewards.expression_match([''], [f'10 {dash} 3'], ['7'])[0] == 1


def test_unicode_dash_between_numbers_is_not_a_sign():
  assert rewards.extract_answer('pages 3\u20135') == '5'  # en dash after a digit: a range


# (completion, reference, numeric_match and boxed_numeric reward)
_FORMS = [
    ('\\boxed{x = 5}', '5', 1),
    ('\\boxed{x=5}', '5', 1),
    ('\\boxed{n_1 = 5}', '5', 1),
    ('\\boxed{y = \\frac{1}{2}}', '0.5', 1),
    ('\\boxed{5 \\text{ apples}}', '5', 1),
    ('\\boxed{5\\text{cm}}', '5', 1),
    ('\\boxed{5 \\mbox{ m}}', '5', 1),
    ('\\boxed{x = 5 \\text{ apples}}', '5', 1),
    ('\\boxed{\\$5}', '5', 1),
    ('\\boxed{\\$1,000.00}', '1000', 1),
    ('\\boxed{5\\%}', '5', 1),
    ('\\boxed{5\\,\\%}', '5', 1),
    ('\\boxed{5%}', '5', 1),
    ('\\boxed{30^\\circ}', '30', 1),
    ('\\boxed{30^{\\circ}}', '30', 1),
    ('\\boxed{\\frac{3}{4}}', '0.75', 1),
    ('\\boxed{\\frac{3}{4}}', '3/4', 1),
    ('\\boxed{\\dfrac34}', '3/4', 1),
    ('\\boxed{\\dfrac34}', '0.75', 1),
    ('\\boxed{\\tfrac{3}4}', '0.75', 1),
    ('\\boxed{\\frac3{4}}', '0.75', 1),
    ('\\boxed{-\\dfrac34}', '-0.75', 1),
    # negative controls
    ('\\boxed{x = 6}', '5', 0),
    ('\\boxed{x = 5}', '6', 0),
    ('\\boxed{5x}', '5', 0),  # a product, not a unit
    ('\\boxed{5 apples}', '5', 0),  # units only count inside \\text{}
    ('\\boxed{x + y = 5}', '5', 0),  # only a single variable on the left
    ('\\boxed{5\\%}', '0.05', 0),  # percent is a unit label (module docstring)
    ('\\boxed{5\\%}', '6', 0),
    ('\\boxed{\\$5}', '6', 0),
    ('\\boxed{5 \\text{ apples}}', '6', 0),
    ('\\boxed{\\dfrac34}', '4/3', 0),
    ('\\boxed{\\frac345}', '0.75', 0),  # \\frac{3}{4}5 is not a number
    ('\\boxed{\\frac{3}{4}}', '34', 0),
]


@pytest.mark.parametrize('completion, answer, want', _FORMS)
def test_decorated_boxed_answers(completion, answer, want):
  got_numeric = rewards.numeric_match([''], [completion], [answer])[0]
  got_boxed = rewards.boxed_numeric([''], [completion], [answer])[0]
  assert (got_numeric, got_boxed) == (want, want)


@pytest.mark.parametrize(
    'completion, answer, want',
    [
        ('The answer is 3 / 4', '0.75', 1),
        ('The answer is 3 / 4.', '3/4', 1),
        ('the answer is 3 /4', '3/4', 1),
        ('so I have 3 / 4 of it', '0.75', 1),  # last-number fallback keeps the fraction
        ('The answer is 3 / 4', '3', 0),
        ('The answer is 3 / 4', '4', 0),
        ('The answer is 12 / 3', '4', 1),
        ('The answer is $5.', '5', 1),
        ('The answer is 5%.', '5', 1),
        ('The answer is \\$5.', '5', 1),
    ],
)
def test_answer_is_forms(completion, answer, want):
  assert rewards.numeric_match([''], [completion], [answer])[0] == want


def test_decoration_is_stripped_on_both_sides():
  # A decorated reference compares with a plain completion and vice versa.
  assert rewards.numbers_equal('5\\%', '5')
  assert rewards.numbers_equal('\\$5', '5.00')
  assert rewards.numbers_equal('x = \\dfrac12', '0.5')
  assert not rewards.numbers_equal('x = 5', 'y = 6')
  assert rewards.answer_number_text('x = 5 \\text{ apples}') == '5'
  assert rewards.answer_number_text('\\$5\\,\\%') == '5'


@FUZZ
@hypothesis.given(
    st.integers(-10**6, 10**6),
    st.sampled_from([
        'x = #', '# \\text{ apples}', '\\$#', '#\\%', '#\\,\\%', '#^\\circ', '$#$.',
        '\\$# \\text{ off}'
    ]),
)
def test_decorations_never_change_the_value(n, template):
  text = template.replace('#', str(n))
  assert rewards.parse_number(text) == n
  assert rewards.parse_number(text.replace('-', '\u2212')) == n
