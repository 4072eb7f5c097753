"""A record as the trainer reads it (jtc.data.examples): a `Reference` answer is its answer as a
str and carries its row's data_source and fields through copies and pickles; a synthetic task's
record keeps a plain answer."""
import copy
import json
import pickle

from jtc.data import examples
from jtc.data import rewards


def test_a_reference_is_its_answer_and_keeps_its_row():
  row = {'reward_model': {'ground_truth': '7'}, 'data_source': 'openai/gsm8k'}
  record = {
      'prompt': 'q',
      'answer': '7',
      'solution': '#### 7',
      'messages': '',
      'data_source': 'openai/gsm8k',
      'row': json.dumps(row)
  }
  example = examples.as_example(record)
  answer = example['answer']
  assert isinstance(answer, examples.Reference) and answer == '7' and 'row' not in example
  assert rewards.numeric_match(['q'], ['#### 7'], [answer])[0] == 1.0  # verifiers read a str
  for again in (pickle.loads(pickle.dumps(answer)), copy.deepcopy(answer)):
    assert isinstance(again, examples.Reference) and again == '7'
    assert again.data_source == 'openai/gsm8k' and again.row == row
  plain = examples.as_example({'prompt': 'q', 'answer': '7', 'messages': ''})['answer']
  assert type(plain) is str  # pylint: disable=unidiomatic-typecheck
