"""Tests for jtc.models.tokenizer: round trips, specials, chat templates."""
import json

import hypothesis
import hypothesis.strategies as st
import pytest
import tokenizers

from jtc.models import tokenizer as tok_lib
from jtc.data.tasks import get_task


@hypothesis.settings(max_examples=100, deadline=None, derandomize=True)
@hypothesis.given(st.text(alphabet=tok_lib.DEFAULT_ALPHABET, max_size=80))
def test_char_round_trip(text):
  tok = tok_lib.CharTokenizer()
  ids = tok.encode(text)
  assert len(ids) == len(text)
  assert all(tok.bos_id < i < tok.vocab_size for i in ids)  # never a special id
  assert tok.decode(ids) == text
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id]) == text


def test_char_specials_and_protocol():
  tok = tok_lib.CharTokenizer()
  assert isinstance(tok, tok_lib.Tokenizer)
  assert len({tok.pad_id, tok.eos_id, tok.bos_id}) == 3
  assert tok.vocab_size == len(tok_lib.DEFAULT_ALPHABET) + 3
  assert tok.apply_chat_template('What is 2+3?') == 'What is 2+3? '
  assert [tok.id_to_token(i) for i in tok.encode('ab')] == ['a', 'b']


def test_char_covers_every_task_text():
  tok = tok_lib.CharTokenizer()
  for name in ('arithmetic', 'countdown'):
    task = get_task(name)
    for ex in task.examples('train', seed=0, num_examples=50):
      for text in [ex['prompt'], *ex['solutions'].values()]:
        assert tok.decode(tok.encode(text)) == text


def test_char_unknown_character_named():
  tok = tok_lib.CharTokenizer(alphabet='0123456789+', chat_separator='')
  with pytest.raises(ValueError, match=r"'x' at position 1"):
    tok.encode('1x2')
  with pytest.raises(ValueError, match='repeated'):
    tok_lib.CharTokenizer(alphabet='aa')
  with pytest.raises(ValueError, match='out of range'):
    tok.decode([tok.vocab_size])


def _write_hf(tmp_path, config=None):
  corpus = ['what is two plus three', 'the answer is five', 'hello world'] * 5
  model = tokenizers.models.WordLevel(unk_token='[UNK]')
  tk = tokenizers.Tokenizer(model)
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tk.decoder = tokenizers.decoders.WordPiece(prefix='##')  # joins words with spaces
  trainer = tokenizers.trainers.WordLevelTrainer(
      special_tokens=['[UNK]', '<pad>', '<s>', '</s>', '<|user|>'])
  tk.train_from_iterator(corpus, trainer)
  path = tmp_path / 'tokenizer.json'
  tk.save(str(path))
  if config is not None:
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps(config))
  return path


TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|user|> {{ m['content'] }}{% endfor %}"
            '{% if add_generation_prompt %} the answer is{% endif %}')


def test_hf_tokenizer_round_trip_and_template(tmp_path):
  config = {
      'eos_token': '</s>',
      'bos_token': {
          'content': '<s>'
      },
      'pad_token': '<pad>',
      'chat_template': TEMPLATE
  }
  _write_hf(tmp_path, config)
  tok = tok_lib.get_tokenizer(str(tmp_path))
  assert isinstance(tok, tok_lib.HFTokenizer) and isinstance(tok, tok_lib.Tokenizer)
  text = 'what is two plus three'
  ids = tok.encode(text)
  assert len(ids) == 5 and tok.decode(ids) == text
  assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text  # specials dropped
  assert len({tok.pad_id, tok.eos_id, tok.bos_id}) == 3
  rendered = tok.apply_chat_template('hello world')
  assert rendered == '<s><|user|> hello world the answer is'
  assert tok.encode(rendered)[0] == tok.bos_id


def test_hf_tokenizer_fallbacks(tmp_path):
  path = _write_hf(tmp_path)  # no tokenizer_config.json
  tok = tok_lib.HFTokenizer(str(path))
  assert tok.apply_chat_template('hello') == 'hello'  # documented fallback
  assert tok.eos_id == tok.encode('</s>')[0] and tok.pad_id == tok.eos_id and tok.bos_id is None
  (tmp_path / 'tokenizer_config.json').write_text(
      json.dumps({
          'eos_token': '</s>',
          'chat_template': [{
              'name': 'default',
              'template': "Q: {{ messages[0]['content'] }}"
          }]
      }))
  assert tok_lib.HFTokenizer(str(path)).apply_chat_template('hi') == 'Q: hi'


def test_hf_tokenizer_bad_input(tmp_path):
  with pytest.raises(FileNotFoundError, match='not found'):
    tok_lib.HFTokenizer(str(tmp_path / 'missing.json'))
  with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
    tok_lib.get_tokenizer('nope')
  path = _write_hf(tmp_path, {'eos_token': '<nothere>'})
  with pytest.raises(ValueError, match='no eos token'):
    tok_lib.HFTokenizer(str(path))


def test_from_spec(tmp_path):
  assert isinstance(tok_lib.from_spec({'kind': 'char'}), tok_lib.CharTokenizer)
  assert tok_lib.from_spec({
      'kind': 'char',
      'chat_separator': '\n'
  }).apply_chat_template('q') == 'q\n'
  _write_hf(tmp_path, {'eos_token': '</s>'})
  assert tok_lib.from_spec({'kind': 'hf', 'path': str(tmp_path)}).eos_id is not None
  with pytest.raises(ValueError, match=r"unknown tokenizer kind 'bpe'.*\['char', 'hf'\]"):
    tok_lib.from_spec({'kind': 'bpe'})


def test_hf_tokenizer_reads_generation_config_eos_ids(tmp_path):
  """generation_config.json's eos_token_id (an int or a list) adds end-of-generation ids after
    the tokenizer's own EOS; with no eos_token declared its first id becomes the EOS."""
  _write_hf(tmp_path, {'eos_token': '</s>', 'chat_template': TEMPLATE})
  vocab = tokenizers.Tokenizer.from_file(str(tmp_path / 'tokenizer.json')).get_vocab()
  eos, user, pad = vocab['</s>'], vocab['<|user|>'], vocab['<pad>']
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': [user, eos]}))
  tok = tok_lib.HFTokenizer.from_dir(str(tmp_path))
  assert tok.eos_id == eos and tok.eos_ids == (eos, user)
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({}))
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': pad}))
  tok = tok_lib.HFTokenizer.from_dir(str(tmp_path))
  assert tok.eos_id == pad and tok.eos_ids == (pad,) and tok.pad_id == pad
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': [10**6]}))
  with pytest.raises(ValueError, match='1000000'):
    tok_lib.HFTokenizer.from_dir(str(tmp_path))


def test_hf_tokenizer_renders_message_lists_like_a_prompt(tmp_path):
  _write_hf(tmp_path, {'eos_token': '</s>', 'bos_token': '<s>', 'chat_template': TEMPLATE})
  tok = tok_lib.get_tokenizer(str(tmp_path))
  assert tok.apply_chat_template([{
      'role': 'user',
      'content': 'hello'
  }]) == (tok.apply_chat_template('hello'))
  assert tok.encode('hello world', add_special_tokens=False) == tok.encode('hello world')


def test_an_hf_tokenizer_matches_transformers(tmp_path):
  transformers = pytest.importorskip('transformers')
  words = [
      '<pad>', '<|im_end|>', '<|endoftext|>', '<|im_start|>', 'hello', 'world', 'user', 'assistant',
      '[UNK]', '\n'
  ]
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel({
          w: i for i, w in enumerate(words)
      }, unk_token='[UNK]'))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(['<pad>', '<|im_end|>', '<|endoftext|>', '<|im_start|>'])
  tok.save(str(tmp_path / 'tokenizer.json'))
  template = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}"
              '<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant'
              '{% endif %}')
  (tmp_path / 'tokenizer_config.json').write_text(
      json.dumps({
          'tokenizer_class': 'PreTrainedTokenizerFast',
          'chat_template': template,
          'eos_token': {
              '__type': 'AddedToken',
              'content': '<|im_end|>',
              'lstrip': False,
              'normalized': False,
              'rstrip': False,
              'single_word': False,
              'special': True
          },
          'pad_token': '<pad>'
      }))
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': [1, 2]}))

  ours = tok_lib.HFTokenizer.from_dir(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
  text = 'hello world <|im_end|> bogus'
  assert ours.encode(text) == theirs.encode(text, add_special_tokens=False) == [4, 5, 1, 8]
  assert (ours.eos_id, ours.pad_id, ours.bos_id) == (theirs.eos_token_id, theirs.pad_token_id, None)
  assert ours.eos_ids == (1, 2)
  assert ours.decode([4, 5, 1]) == theirs.decode([4, 5, 1], skip_special_tokens=True)
  messages = [{'role': 'user', 'content': 'hello'}]
  assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True)


def test_an_hf_tokenizer_without_its_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='tokenizer.json'):
    tok_lib.HFTokenizer.from_dir(str(tmp_path))
