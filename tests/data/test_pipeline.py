"""Tests for jtc.data.pipeline: the grain pipeline over prepared records (epochs, seeded shuffles,
state restore, shards), prompt encoding (chat messages through the template), JSONL datasets with
their errors, the `data` section's checks and held-out split."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs import common
from jtc.data import pipeline as data
from jtc.data import datasets
from jtc.data import examples
from jtc.data import formats
from jtc.models import tokenizer as tok_lib
from jtc.data.tasks import get_task

SIZES = {'train': 48, 'test': 12}


def _iter(data_dir, **kwargs):
  base = dict(split='train', batch_size=8, seed=0, data_dir=data_dir, num_examples=SIZES,
              shard_index=0, shard_count=1)
  return data.make_prompt_iterator('arithmetic', **{**base, **kwargs})


def test_one_epoch_holds_exactly_the_task_examples(data_dir):
  it = _iter(data_dir, num_epochs=1, drop_remainder=False, batch_size=5)
  batches = list(it)
  assert [len(b['prompt']) for b in batches] == [5] * 9 + [3]
  got = [(p, a, s)
         for b in batches
         for p, a, s in zip(b['prompt'], b['answer'], b['solutions']['steps'])]
  want = get_task('arithmetic').examples('train', seed=0, num_examples=SIZES['train'])
  assert sorted(got) == sorted((e['prompt'], e['answer'], e['solutions']['steps']) for e in want)
  assert all(isinstance(p, str) for p, _, _ in got)


def test_shuffle_is_seeded_and_epochs_reshuffle(data_dir):

  def order(seed):
    it = _iter(data_dir, seed=seed, batch_size=6)
    return [p for _ in range(16) for p in next(it)['prompt']]  # two epochs of 48

  a, b = order(0), order(1)
  assert a == order(0) and a != b
  assert sorted(a[:48]) == sorted(a[48:]) and a[:48] != a[48:]


def test_state_restore_continues_with_the_same_batches(data_dir):
  it = _iter(data_dir, batch_size=7)
  for _ in range(9):  # past the first epoch boundary
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(5)]
  restored = _iter(data_dir, batch_size=7)
  restored.set_state(json.loads(json.dumps(state)))  # the state survives serialization
  assert [next(restored) for _ in range(5)] == want


def test_shards_are_disjoint_equal_and_cover(data_dir):
  shards = [[
      p
      for b in _iter(data_dir, shard_index=i, shard_count=3, num_epochs=1, batch_size=4)
      for p in b['prompt']
  ]
            for i in range(3)]
  assert [len(s) for s in shards] == [16, 16, 16]
  assert len(set().union(*map(set, shards))) == 48
  with pytest.raises(ValueError, match='shard_index'):
    _iter(data_dir, shard_index=3, shard_count=3)


def test_default_sharding_uses_jax_process(data_dir):
  it = data.make_prompt_iterator('arithmetic', split='test', batch_size=4, seed=0,
                                 data_dir=data_dir, num_examples=SIZES)
  assert len(next(it)['prompt']) == 4


def test_tokens_in_batches(data_dir):
  tok = tok_lib.CharTokenizer()
  batch = next(_iter(data_dir, tokenizer=tok, prompt_width=24))
  assert batch['prompt_tokens'].shape == (8, 24) and batch['prompt_tokens'].dtype == np.int32
  for row, mask, prompt in zip(batch['prompt_tokens'], batch['prompt_mask'], batch['prompt']):
    assert tok.decode(row[mask == 1]) == tok.apply_chat_template(prompt)


def test_encode_prompts_left_pads():
  tok = tok_lib.CharTokenizer()
  prompts = ['What is 1+2?', 'What is 10*99?', '']
  tokens_BP, mask_BP = data.encode_prompts(tok, prompts, width=20)
  assert tokens_BP.dtype == np.int32 and mask_BP.dtype == np.int32 and tokens_BP.shape == (3, 20)
  for b, p in enumerate(prompts):  # reference built with a plain loop
    ids = [tok.bos_id] + [tok.encode(c)[0] for c in tok.apply_chat_template(p)]
    want = [tok.pad_id] * (20 - len(ids)) + ids
    assert tokens_BP[b].tolist() == want
    assert mask_BP[b].tolist() == [0] * (20 - len(ids)) + [1] * len(ids)
  no_bos, _ = data.encode_prompts(tok, ['ab'], width=4, add_bos=False, chat_template=False)
  assert no_bos.tolist() == [[0, 0] + tok.encode('ab')]
  with pytest.raises(ValueError, match="'What is 10\\*99\\?' has 16 tokens"):
    data.encode_prompts(tok, prompts, width=15)


def _write(path, lines):
  path.write_text('\n'.join(lines) + '\n')
  return path


def test_jsonl_gsm8k_and_math(tmp_path, data_dir):
  d = tmp_path / 'mathds'
  d.mkdir()
  _write(d / 'train.jsonl', [
      json.dumps({
          'question': 'Tom has 3 apples and buys 1,000 more.',
          'answer': '3+1000=1003\n#### 1,003'
      }),
      '',
      json.dumps({
          'problem': 'Half of 1?',
          'solution': 'It is $\\boxed{\\frac{1}{2}}$.'
      }),
      json.dumps({
          'question': 'Name?',
          'answer': '#### Bob'
      }),
  ])
  _write(d / 'test.jsonl', [json.dumps({'question': '2+2?', 'answer': '#### 4'})])
  it = data.make_prompt_iterator(str(d), split='train', batch_size=3, seed=0, data_dir=data_dir,
                                 num_epochs=1, shuffle=False, shard_index=0, shard_count=1)
  batch = next(it)
  assert batch['prompt'][0] == 'Tom has 3 apples and buys 1,000 more.'
  assert batch['answer'] == ['1003', '\\frac{1}{2}', 'Bob']
  assert batch['solution'][0].endswith('#### 1,003')
  test = next(
      data.make_prompt_iterator(str(d), split='test', batch_size=1, seed=0, data_dir=data_dir,
                                shard_index=0, shard_count=1))
  assert test['answer'] == ['4']
  with pytest.raises(ValueError, match=r"unknown split 'validation'.*\['test', 'train'\]"):
    data.make_prompt_iterator(str(d), split='validation', batch_size=1, seed=0, data_dir=data_dir,
                              shard_index=0, shard_count=1)


def test_jsonl_errors_name_file_and_line(tmp_path, data_dir):
  bad = _write(tmp_path / 'bad.jsonl', [json.dumps({'question': 'q', 'answer': 'a'}), '{not json'])
  with pytest.raises(ValueError, match=r'bad\.jsonl:2: malformed JSON'):
    datasets.prepare(str(bad), data_dir=data_dir)
  missing = _write(tmp_path / 'missing.jsonl', [json.dumps({'q': 'x', 'answer': '1'})])
  with pytest.raises(ValueError, match=r'missing\.jsonl:1: no question field'):
    formats.read_files('jsonl', [str(missing)])
  arr = _write(tmp_path / 'arr.jsonl', ['[1, 2]'])
  with pytest.raises(ValueError, match=r'arr\.jsonl:1: expected a JSON object'):
    formats.read_files('jsonl', [str(arr)])
  empty = _write(tmp_path / 'empty.jsonl', ['', '  '])
  with pytest.raises(ValueError, match='empty dataset'):
    datasets.prepare(str(empty), data_dir=data_dir)


def test_unknown_source_lists_tasks(data_dir):
  with pytest.raises(ValueError, match=r"unknown task or dataset 'nope'.*arithmetic.*countdown"):
    data.make_prompt_iterator('nope', split='train', batch_size=1, seed=0, data_dir=data_dir)
  with pytest.raises(ValueError, match='unknown splits'):
    datasets.prepare('arithmetic', data_dir=data_dir, num_examples={'dev': 3})


def test_load_examples_matches_the_task(data_dir):
  got = data.load_examples('arithmetic', split='test', data_dir=data_dir, num_examples=SIZES,
                           limit=5)
  want = get_task('arithmetic').examples('test', seed=0, num_examples=SIZES['test'])
  assert got == want[:5]  # stored order is generation order; nested solutions decoded to str
  assert len(data.load_examples('arithmetic', split='test', data_dir=data_dir,
                                num_examples=SIZES)) == 12


def _chat_dataset(tmp_path):
  """A verl-style parquet split of a one-message prompt and a system + user conversation."""
  rows = [{
      'prompt': [{
          'role': 'user',
          'content': 'What is 1+1?'
      }],
      'reward_model': {
          'style': 'rule',
          'ground_truth': '2'
      }
  }, {
      'prompt': [{
          'role': 'system',
          'content': 'Be brief.'
      }, {
          'role': 'user',
          'content': 'What is 2+2?'
      }],
      'reward_model': {
          'style': 'rule',
          'ground_truth': '4'
      }
  }]
  path = str(tmp_path / 'chat.parquet')
  pq.write_table(pa.Table.from_pylist(rows), path)
  return path, rows


def test_chat_messages_reach_the_chat_template(tmp_path, data_dir):
  path, rows = _chat_dataset(tmp_path)
  batch = next(
      data.make_prompt_iterator(path, split='train', batch_size=2, seed=0, data_dir=data_dir,
                                shuffle=False, shard_index=0, shard_count=1))
  assert batch['answer'] == ['2', '4'] and 'messages' not in batch
  plain, chat = batch['prompt']
  assert type(plain) is str and plain == 'What is 1+1?'
  assert isinstance(chat, examples.Conversation) and chat.messages == rows[1]['prompt']
  tok_lib.write_byte_level_hf(str(tmp_path / 'tok'))
  tok = tok_lib.HFTokenizer.from_dir(str(tmp_path / 'tok'))
  suffix = ' Answer in \\boxed{}.'

  def rendered(prompt, **kwargs):
    return tok.decode(data.prompt_ids(tok, prompt + suffix, **kwargs), skip_special_tokens=False)

  # ChatML written out by hand: each message in its own block, the suffix on the user's.
  assert rendered(chat) == ('<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is '
                            f'2+2?{suffix}<|im_end|>\n<|im_start|>assistant\n')
  assert rendered(plain) == (f'<|im_start|>user\nWhat is 1+1?{suffix}<|im_end|>\n'
                             '<|im_start|>assistant\n')
  assert rendered(chat, chat_template=False) == f'Be brief.\n\nWhat is 2+2?{suffix}'
  # Without a chat template, a conversation is an error, a question stays itself.
  tok.chat_template = None
  assert rendered(plain) == f'What is 1+1?{suffix}'
  with pytest.raises(ValueError, match='no chat_template'):
    rendered(chat)
  with pytest.raises(ValueError, match='CharTokenizer has no chat template'):
    data.prompt_ids(tok_lib.CharTokenizer(), chat)


def _data_config(**overrides):
  c = common.get_config(None).data
  with c.unlocked():
    c.update(overrides)
  return c


def test_check_config_detects_the_dataset_before_any_compute(tmp_path):
  path, _ = _chat_dataset(tmp_path)
  check = lambda **kw: data.check_config(_data_config(**kw), tasks={'arithmetic'}, reward_fns=
                                         {'boxed_numeric'})
  check(dataset=path, eval_dataset=path, question_field='', task='')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(ValueError, match=r'config\.data\.dataset=.*empty.*no data files'):
    check(dataset=str(tmp_path / 'empty'))
  with pytest.raises(ValueError, match=r'config\.data\.eval_dataset=.*not found'):
    check(dataset=path, eval_dataset=str(tmp_path / 'nope.jsonl'))
  with pytest.raises(ValueError, match=r"config\.data\.question_field='q' needs config\.data"):
    check(question_field='q')


def test_held_out_split(tmp_path):
  path, _ = _chat_dataset(tmp_path)
  assert data.held_out_split(path) == 'train'  # a file: its only split
  splits = tmp_path / 'splits'
  splits.mkdir()
  for split in ('train', 'test', 'validation'):
    _write(splits / f'{split}.jsonl', [json.dumps({'question': 'q', 'answer': '1'})])
  assert data.held_out_split(str(splits)) == 'test'
  (splits / 'test.jsonl').unlink()
  with pytest.raises(ValueError, match=r"no test split.*\['train', 'validation'\]"):
    data.held_out_split(str(splits))


def test_a_dataset_of_one_split_trains_on_it(tmp_path):
  """A directory holding only dapo-math-17k.parquet trains on that split (it once passed
  `jtc data` and failed in training for want of a 'train' split); several splits without
  'train' are named."""
  one = tmp_path / 'one'
  one.mkdir()
  (one / 'dapo-math-17k.jsonl').write_text('{"question": "q", "answer": "1"}\n')
  assert data.train_split(str(one)) == 'dapo-math-17k'
  (one / 'other.jsonl').write_text('{"question": "q", "answer": "1"}\n')
  with pytest.raises(ValueError, match=r"no train split.*\['dapo-math-17k', 'other'\]"):
    data.train_split(str(one))
  (one / 'train.jsonl').write_text('{"question": "q", "answer": "1"}\n')
  assert data.train_split(str(one)) == 'train'
