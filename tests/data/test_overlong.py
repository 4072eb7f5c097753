"""Tests for jtc.data.overlong's pure parts: where a prompt's last user turn begins, the left cut
in closed form (BOS kept, never past the tokens before the last turn), the mode check and the
printed count. The tokenizer side (`pipeline.fitted_ids`) is tested in test_pipeline.py."""
import pytest

from jtc.data import examples
from jtc.data import overlong


def test_the_modes_are_checked():
  for mode in overlong.MODES:
    overlong.check(mode)
  with pytest.raises(ValueError, match=r"overlong='left' is not valid; valid: \['error', 'drop', "):
    overlong.check('left')


def test_the_last_turn_begins_after_the_message_before_it():
  chat = examples.Conversation([
      {
          'role': 'system',
          'content': 'Be brief.'
      },
      {
          'role': 'user',
          'content':
              'Be brief.'  # the same text as the system message: the last one is the question
      }
  ])
  text = '<s>system: Be brief.</s><s>user: Be brief.</s><s>assistant:'
  assert text[:overlong.last_turn_start(text, chat)] == '<s>system: Be brief.'
  assert overlong.last_turn_start('What is 2+2?', 'What is 2+2?') == 0  # one message
  assert overlong.last_turn_start('unrelated', chat) == 0  # messages not found: nothing cut


def test_common_prefix():
  assert overlong.common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
  assert overlong.common_prefix([], [1]) == 0
  assert overlong.common_prefix([7, 8], [7, 8]) == 2


@pytest.mark.parametrize('n, width, head, cuttable', [(10, 6, 1, 4), (10, 6, 0, 9), (10, 10, 1, 0),
                                                      (12, 5, 1, 7)])
def test_the_left_cut_keeps_the_head_and_the_end(n, width, head, cuttable):
  ids = list(range(100, 100 + n))
  got = overlong.cut_left(ids, width=width, head=head, cuttable=cuttable)
  assert len(got) == min(n, width)
  assert got[:head] == ids[:head]  # BOS stays first
  assert got[head:] == ids[n - len(got) + head:]  # the end (the last turn) is untouched


def test_a_cut_into_the_question_is_refused():
  with pytest.raises(
      ValueError, match=r'takes 10 tokens and cutting the 5 over '
      r'config.data.prompt_width=5 .*\(only 4 tokens precede its last user turn'):
    overlong.cut_left(list(range(10)), width=5, head=1, cuttable=4)
  with pytest.raises(ValueError, match='overlong=drop'):
    overlong.cut_left(list(range(3)), width=1, head=1, cuttable=5)  # only the BOS would be left


def test_the_note_counts():
  assert overlong.note(
      'drop', over=3, total=10, what='training',
      width=64) == ("config.data.overlong='drop': dropped 3 of 10 training prompts longer than "
                    'config.data.prompt_width=64 tokens')
  assert 'truncated on the left 0 of 5 held-out' in overlong.note('truncate', over=0, total=5,
                                                                  what='held-out', width=8)
