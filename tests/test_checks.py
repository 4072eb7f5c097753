"""Tests of jtc.checks: each check passes the valid values and names the key, the value and what
is valid for the others; `nearest` suggests close names only; `flatten` gives dotted keys."""
import pytest

from jtc import checks


@pytest.mark.parametrize(
    'check, good, bad, message',
    [
        (lambda v: checks.choice('k', v,
                                 ('a', 'b')), 'a', 'c', "k='c' is not valid; valid: ['a', 'b']"),
        (lambda v: checks.positive('k', v), 0.5, 0.0, 'k=0.0 must be > 0'),
        (lambda v: checks.positive('k', v), 1, True, 'k=True must be > 0'),  # a bool is no number
        (lambda v: checks.positive_int('k', v), 3, 2.0, 'k=2.0 must be an int >= 1'),
        (lambda v: checks.in_range('k', v, low=0, high=1, high_open=True), 0, 1.0,
         'k=1.0 must be a number in [0, 1)'),
        (lambda v: checks.in_range('k', v, low=0, integer=True), 4, 0.5,
         'k=0.5 must be an int in [0, inf)'),
        (lambda v: checks.group_size(v, 12), 4, 5,
         'group_size=5 must be a positive int dividing B=12'),
    ])
def test_a_check_passes_the_valid_and_names_the_invalid(check, good, bad, message):
  check(good)
  with pytest.raises(ValueError) as e:
    check(bad)
  assert str(e.value) == message


def test_nearest_suggests_only_close_names():
  assert checks.nearest('learnin_rate',
                        ['learning_rate', 'warmup_frac']) == ("; did you mean 'learning_rate'?")
  assert checks.nearest('zzz', ['learning_rate']) == ''


def test_flatten_gives_dotted_keys():
  assert checks.flatten({'a': {'b': 1, 'c': {'d': 2}}, 'e': 3}) == {'a.b': 1, 'a.c.d': 2, 'e': 3}


def test_assignments_parse_literals_and_name_a_bad_item():
  assert checks.assignments('--hparams', 'a=1,b=0.5,c=None,d=token_mean,e=True') == {
      'a': 1,
      'b': 0.5,
      'c': None,
      'd': 'token_mean',
      'e': True
  }
  assert checks.assignments('--hparams', '') == {}
  with pytest.raises(ValueError, match="--hparams 'b': expected key=value"):
    checks.assignments('--hparams', 'a=1,b')
