"""Users' reward functions (jtc.data.custom_rewards): verl's compute_score and TRL's reward
functions, unchanged, score in the verifier pool with the row's data_source, ground truth,
extra_info and columns; a failure (raises, not a finite number, times out) scores 0 and is
counted by kind; a function that cannot take its signature's arguments is refused before any
compute. The functions are tests/data/user_rewards.py's."""
import os

import numpy as np
import pytest

from jtc.analysis import metric_writer
from jtc.data import custom_rewards
from jtc.data import examples
from jtc.rl import trainer as trainer_lib
from tests.rl import test_real_configs as real_configs
from tests.rl.test_real_configs import tiny_hf  # noqa: F401  pylint: disable=unused-import

VERL = 'tests.data.user_rewards:compute_score'


def ref(reference, source='openai/gsm8k', **row):
  return examples.Reference(reference, data_source=source, row=row)


def test_verl_compute_score_gets_the_rows_fields_and_its_dict_score_is_read(capsys):
  answers = [
      ref('7', reward_model={'ground_truth': '7'}, extra_info={'index': 3}),
      ref('7', reward_model={'ground_truth': '8'}),  # verl's ground truth is the row's
      ref('7', source='broken/source', reward_model={'ground_truth': '7'}),
      '7',  # a plain reference answer (a synthetic task's): ground truth = the answer
  ]
  with custom_rewards.CustomReward(VERL, signature='verl', workers=1, timeout_s=60) as fn:
    scores = fn(['q'] * 4, ['so #### 7'] * 4, answers)
    np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0, 1.0])
    assert fn.take_metrics() == {
        'reward/failed': 1.0
    } and fn.take_metrics() == {
        'reward/failed': 0.0
    }
  err = capsys.readouterr().err
  assert 'ValueError: no scorer for this source' in err and 'failed on 1 of 4 answers' in err


def test_every_failure_scores_zero_and_is_counted_by_kind(capsys):
  spec = 'tests.data.user_rewards:misbehaving'
  texts = ['ok', 'text', 'none', 'nan', 'raise', 'hang', 'ok']
  with custom_rewards.CustomReward(spec, signature='verl', workers=2, timeout_s=2.0) as fn:
    scores = fn(['q'] * len(texts), texts, ['a'] * len(texts))
    np.testing.assert_array_equal(scores, [1, 0, 0, 0, 0, 0, 1])
    assert fn.failed == 5 and fn.reasons == {
        'TypeError': 3,
        'RuntimeError': 1,
        'took over 2 s (timed out)': 1
    }
  err = capsys.readouterr().err
  assert 'returned str' in err and 'failed on 5 of 7 answers' in err


def test_trl_functions_get_lists_and_the_raw_columns(tmp_path, monkeypatch):
  # A file path names the module too; TRL's example gets completions, the raw 'answer' column.
  monkeypatch.chdir(tmp_path)
  path = os.path.join(os.path.dirname(__file__), 'user_rewards.py')
  with custom_rewards.CustomReward(f'{path}:reward_len', signature='trl', workers=1,
                                   timeout_s=60) as fn:
    np.testing.assert_array_equal(fn(['p', 'p'], ['x' * 20, 'x' * 25], ['1', '2']), [0, -5])
  answers = [ref('4', source='', answer='2+2\n#### 4'), ref('5', source='', answer='#### 5')]
  with custom_rewards.CustomReward('tests.data.user_rewards:trl_correct', signature='trl',
                                   workers=1, timeout_s=60) as fn:
    np.testing.assert_array_equal(fn(['p', 'p'], ['it is 4', 'it is 4'], answers), [1, 0])
  chat = [examples.Conversation([{'role': 'user', 'content': 'hi'}]), 'plain question']
  with custom_rewards.CustomReward('tests.data.user_rewards:trl_chat_even', signature='trl_chat',
                                   workers=1, timeout_s=60) as fn:
    np.testing.assert_array_equal(fn(chat, ['ab', 'abc'], ['1', '1']), [1, 0])
    assert fn.failed == 0


@pytest.mark.parametrize('spec,signature,match', [
    (VERL, 'trl', "reward_signature='trl'"),
    ('tests.data.user_rewards:reward_len', 'verl', "reward_signature='verl'"),
    (VERL, 'openai', "valid: \\['verl', 'trl', 'trl_chat'\\]"),
    ('tests.data.user_rewards:nope', 'verl', "no function 'nope'; its functions: .*compute_score"),
    ('tests.data.no_such_module:f', 'verl', 'cannot be loaded'),
    ('missing/file.py:f', 'verl', 'no such file'),
    ('compute_score', 'verl', 'MODULE:FUNCTION'),
])
def test_a_function_that_cannot_be_called_so_is_refused_before_any_compute(spec, signature, match):
  with pytest.raises(ValueError, match=match):
    if ':' not in spec:
      custom_rewards.load_function(spec)
    custom_rewards.check_signature(custom_rewards.load_function(spec), signature, spec)


@pytest.mark.slow
@pytest.mark.parametrize('spec,signature', [('tests.data.user_rewards:even_length', 'verl'),
                                            ('tests.data.user_rewards:reward_len', 'trl')])
def test_a_verl_and_a_trl_function_unchanged_train_a_smoke_run(spec, signature, tiny_hf, tmp_path):
  """The real config's smoke run (tiny checkpoint, tiny GSM8K) scored by a user's function: the
  rewards vary within groups, the update moves, nothing failed."""
  c = real_configs._real_config(
      'qwen3_0_6b_gsm8k_dfpo', tiny_hf, **{
          'data.reward': spec,
          'data.reward_signature': signature,
          'data.verify_workers': 1
      })
  trainer = trainer_lib.Trainer(c, str(tmp_path))
  last, _ = trainer.run()
  records = metric_writer.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1, 2] and last[0]['step'] == 2
  assert all(r['reward/failed'] == 0 for r in records[1:])
  assert min(r['adv/frac_zero_std'] for r in records[1:]) < 1
  assert max(r['grad_norm'] for r in records[1:]) > 0
