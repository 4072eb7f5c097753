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


def test_a_list_of_files_is_one_split_in_the_order_named(tmp_path, data_dir):
  for name, n in (('part-1.jsonl', 2), ('part-0.jsonl', 3), ('extra.jsonl', 1)):
    _write(tmp_path / name,
           [json.dumps({
               'question': f'{name}:{i}',
               'answer': str(i)
           }) for i in range(n)])
  spec = f'{tmp_path}/part-*.jsonl,{tmp_path}/extra.jsonl'
  got = data.load_examples(spec, split='train', data_dir=data_dir)
  assert [e['prompt'] for e in got] == [
      'part-0.jsonl:0', 'part-0.jsonl:1', 'part-0.jsonl:2', 'part-1.jsonl:0', 'part-1.jsonl:1',
      'extra.jsonl:0'
  ]
  assert data.load_examples(spec, split='train', data_dir=data_dir, keep=[5, 0]) == [got[5], got[0]]
  parquet = tmp_path / 'x.parquet'
  pq.write_table(pa.Table.from_pylist([{'question': 'q', 'answer': '1'}]), str(parquet))
  with pytest.raises(ValueError, match='files of several formats'):
    formats.detect(f'{tmp_path}/extra.jsonl,{parquet}')


def _byte_tokenizer(tmp_path):
  tok_lib.write_byte_level_hf(str(tmp_path / 'tok'))
  return tok_lib.HFTokenizer.from_dir(str(tmp_path / 'tok'))


def test_truncation_cuts_before_the_last_turn_only(tmp_path):
  """A system message loses its first tokens; the last user turn and the template's end stay
  whole; a cut that would reach them, and any cut of a one-message prompt, is refused."""
  tok = _byte_tokenizer(tmp_path)
  chat = examples.Conversation([{
      'role': 'system',
      'content': 'S' * 30
  }, {
      'role': 'user',
      'content': 'What is 2+2?'
  }])
  ids = data.prompt_ids(tok, chat)
  tail = tok.encode('<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n')
  for width in (len(ids), len(ids) - 1, len(tail) + 1, len(tail)):
    got = data.fitted_ids(tok, chat, width=width)
    assert len(got) == width and got == ids[len(ids) - width:]  # no BOS: a plain left cut
  with pytest.raises(ValueError, match=r'What is 2\+2.*cut into its question'):
    data.fitted_ids(tok, chat, width=len(tail) - 1)
  with pytest.raises(ValueError, match='only 0 tokens precede its last user turn'):
    data.fitted_ids(tok, 'What is 2+2?', width=5)
  tokens_BP, mask_BP = data.encode_prompts(tok, [chat, 'Hi'], width=len(tail), truncate=True)
  assert tokens_BP[0].tolist() == ids[len(ids) - len(tail):] and mask_BP.sum(-1)[1] < len(tail)


def test_truncation_keeps_the_bos(tmp_path):
  tok = tok_lib.CharTokenizer()
  chat = examples.Conversation([{
      'role': 'system',
      'content': 'abcdef'
  }, {
      'role': 'user',
      'content': 'xy'
  }])
  ids = data.prompt_ids(tok, chat, chat_template=False)  # [bos] 'abcdef\n\nxy'
  got = data.fitted_ids(tok, chat, width=7, chat_template=False)
  assert got == [tok.bos_id] + ids[-6:] and tok.decode(got) == 'ef\n\nxy'


def _overlong_data(tmp_path, mode, rows):
  path = _write(tmp_path / f'{mode}.jsonl',
                [json.dumps({
                    'question': q,
                    'answer': '1'
                }) for q in rows])
  c = common.get_config(None).data
  with c.unlocked():
    c.update(task='', dataset=str(path), eval_dataset=str(path), overlong=mode, prompt_width=12,
             data_dir=str(tmp_path / 'cache'), chat_template=False)
  return c


def test_drop_leaves_out_the_overlong_prompts_and_counts_them(tmp_path):
  tok = tok_lib.CharTokenizer()
  rows = ['1+1', '9' * 20, '2+2', '3+3', '8' * 30, '4+4']
  got = data.run_data(_overlong_data(tmp_path, 'drop', rows), batch_size=4, seeds=[0],
                      eval_problems=10, tokenizer=tok)
  assert sorted(next(got.train_iters[0])['prompt']) == ['1+1', '2+2', '3+3', '4+4']
  assert [e['prompt'] for e in got.eval_examples] == ['1+1', '2+2', '3+3', '4+4']
  assert got.notes == [
      "config.data.overlong='drop': dropped 2 of 6 training prompts longer than "
      'config.data.prompt_width=12 tokens', "config.data.overlong='drop': dropped 2 of 6 held-out "
      'prompts longer than config.data.prompt_width=12 tokens'
  ]
  with pytest.raises(ValueError, match="'drop' drops every training prompt"):
    data.run_data(_overlong_data(tmp_path, 'drop', ['9' * 20]), batch_size=1, seeds=[0],
                  eval_problems=1, tokenizer=tok)
  with pytest.raises(ValueError, match='pass the tokenizer'):
    data.run_data(_overlong_data(tmp_path, 'drop', rows), batch_size=1, seeds=[0], eval_problems=1)


def test_truncate_refuses_a_question_before_the_run_naming_its_row(tmp_path):
  rows = ['1+1', '2+2', '9' * 20]
  with pytest.raises(
      ValueError, match=r"split 'train' row 2 of .*truncate\.jsonl'.*9999.*cut "
      'into its question'):
    data.run_data(_overlong_data(tmp_path, 'truncate', rows), batch_size=1, seeds=[0],
                  eval_problems=1, tokenizer=tok_lib.CharTokenizer())
  got = data.run_data(_overlong_data(tmp_path, 'truncate', rows[:2]), batch_size=1, seeds=[0],
                      eval_problems=1, tokenizer=tok_lib.CharTokenizer())
  assert got.notes[0].startswith("config.data.overlong='truncate': truncated on the left 0 of 2")
