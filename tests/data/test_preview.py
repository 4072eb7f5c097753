"""A dataset as a run sees it (jtc.data.preview): the prompt with its suffix through the chat
template, its token count against the width (with BOS, as the trainer counts it), and the
verifier's score of the reference solution; the traps follow the rows."""
from configs import common
from jtc.data import preview
from jtc.data import rewards
from jtc.models import tokenizer as tokenizer_lib


def test_a_row_as_the_run_reads_it():
  c = common.get_config()
  with c.unlocked():
    c.data.prompt_suffix, c.data.prompt_width = ' Go.', 16
  tok = tokenizer_lib.CharTokenizer()
  example = {'prompt': 'What is 2+2?', 'answer': '4', 'solution': '2+2=4'}
  lines = preview.preview(c.data, [example], tokenizer=tok, reward_fn=rewards.numeric_match)
  n = len('What is 2+2? Go.') + 1 + 1  # the chat separator and BOS
  assert lines[0] == (f'[0] prompt as the model reads it ({n} tokens; config.data.prompt_width=16: '
                      'DOES NOT FIT):')
  assert lines[1] == '    What is 2+2? Go. '
  assert lines[2].endswith("the verifier scores the reference solution '2+2=4': 1")
  assert len(lines) == 3  # no trap
