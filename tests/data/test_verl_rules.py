"""verl's strict GSM8K rule (jtc.data.verl_rules.gsm8k_strict) against what the rule says, and
where it parts from jtc's lenient numeric_match (the reason the two give different curves)."""
import numpy as np
import pytest

from jtc.data import rewards
from jtc.data import verl_rules

# (completion, reference, strict, lenient numeric_match)
CASES = [
    ('so #### 7', '7', 1, 1),
    ('#### 1,000', '1000', 1, 1),  # commas dropped
    ('#### -3', '-3', 1, 1),
    ('#### 3\nthen #### 7', '7', 1, 1),  # the last one
    ('#### 7.0', '7', 0, 1),  # compared as strings
    ('3 + 4 = 7', '7', 0, 1),  # no '####'
    ('The answer is 7.', '7', 0, 1),
    ('\\boxed{7}', '7', 0, 1),
    ('####7', '7', 0, 1),  # a space after '####' is required
    ('#### $7', '7', 0, 1),
    ('#### 7\n' + ' padding' * 50, '7', 0, 1),  # only the last 300 characters are read
    ('#### 8', '7', 0, 0),
]


@pytest.mark.parametrize('completion,reference,strict,lenient', CASES)
def test_the_strict_rule_and_the_lenient_one(completion, reference, strict, lenient):
  assert verl_rules.gsm8k_strict([''], [completion], [reference])[0] == strict
  assert rewards.get_reward_fn('gsm8k_strict')([''], [completion], [reference])[0] == strict
  assert rewards.numeric_match([''], [completion], [reference])[0] == lenient


def test_a_batch_is_float32_of_its_length():
  out = verl_rules.gsm8k_strict(['q'] * 3, ['#### 1', '#### 2', 'x'], ['1', '1', '1'])
  assert out.dtype == np.float32 and out.tolist() == [1.0, 0.0, 0.0]
  with pytest.raises(ValueError, match='equal length'):
    verl_rules.gsm8k_strict(['q'], ['a', 'b'], ['1'])
