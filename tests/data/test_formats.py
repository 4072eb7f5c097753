"""Tests of jtc.data.formats: datasets in the exact schemas researchers bring (verl's GSM8K, MATH
and DAPO-Math-17k parquet rows, a Hugging Face dataset saved with save_to_disk, JSONL with named
fields) read back as written, detection of the format, the `Conversation` prompt, and every
malformed row named by file, row and field."""
import json
import os
import pickle
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jtc.data import examples
from jtc.data import formats

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DAPO_TEMPLATE = ('Solve the following math problem step by step. The last line of your response '
                 'should be of the form Answer: $Answer (without quotes) where $Answer is the '
                 'answer to the problem.\n\n{}\n\nRemember to put your answer on its own line '
                 'after "Answer:".')


def gsm8k_rows(split, n=4):
  """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
  rows = []
  for i in range(n):
    question, worked = f'Ann has {i} pens and buys 1,000 more. How many?', f'{i}+1000\n#### {i + 1000:,}'
    rows.append({
        'data_source': 'openai/gsm8k',
        'prompt': [{
            'role': 'user',
            'content': question + ' ' + GSM8K_INSTRUCTION
        }],
        'ability': 'math',
        'reward_model': {
            'style': 'rule',
            'ground_truth': str(i + 1000)
        },
        'extra_info': {
            'split': split,
            'index': i,
            'answer': worked,
            'question': question
        },
    })
  return rows


def math_rows(split, n=4):
  """Rows as verl's examples/data_preprocess/math_dataset.py writes them."""
  return [{
      'data_source': 'DigitalLearningGmbH/MATH-lighteval',
      'prompt': [{
          'role': 'user',
          'content': f'What is $1/{i + 2}$ of 1? ' + MATH_INSTRUCTION
      }],
      'ability': 'math',
      'reward_model': {
          'style': 'rule',
          'ground_truth': f'\\frac{{1}}{{{i + 2}}}'
      },
      'extra_info': {
          'split': split,
          'index': i
      },
  } for i in range(n)]


def dapo_rows(split, n=4):
  """Rows as DAPO-Math-17k's parquet holds them (data_source 'math_dapo')."""
  del split
  return [{
      'data_source': 'math_dapo',
      'prompt': [{
          'role': 'user',
          'content': DAPO_TEMPLATE.format(f'Find the sum of {i} and 30.')
      }],
      'ability': 'MATH',
      'reward_model': {
          'ground_truth': str(i + 30),
          'style': 'rule-lighteval/MATH_v2'
      },
      'extra_info': {
          'index': str(uuid.UUID(int=i))
      },
  } for i in range(n)]


VERL = {'gsm8k': gsm8k_rows, 'math': math_rows, 'dapo': dapo_rows}


def write_parquet(path, rows):
  return write_table(path, pa.Table.from_pylist(rows))


def write_table(path, table):
  pq.write_table(table, str(path))
  return str(path)


def write_bytes(path, data):
  path.write_bytes(data)
  return str(path)


def write_jsonl(path, rows):
  with open(path, 'w', encoding='utf-8') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def core(records):
  """Records (a list, or ``{split: list}``) without their ``row`` (the raw fields, JSON)."""
  if isinstance(records, dict):
    return {split: core(part) for split, part in records.items()}
  return [{k: v for k, v in r.items() if k != 'row'} for r in records]


def expected_verl(row):
  """What jtc should read from a verl row, computed from the row as written (but its ``row``)."""
  worked = (row.get('extra_info') or {}).get('answer')
  return {
      'prompt': row['prompt'][0]['content'],
      'answer': row['reward_model']['ground_truth'],
      'solution': worked or row['reward_model']['ground_truth'],
      'messages': '',
      'data_source': row.get('data_source', ''),
  }


@pytest.mark.parametrize('name', VERL)
def test_verl_parquet_reads_back_as_written(tmp_path, name):
  rows = {split: VERL[name](split, n) for split, n in (('train', 5), ('test', 2))}
  for split, part in rows.items():
    write_parquet(tmp_path / f'{split}.parquet', part)
  source = formats.detect(str(tmp_path))
  assert source.format == 'parquet' and sorted(source.splits) == ['test', 'train']
  got = formats.read_source(source)
  assert core(got) == {split: [expected_verl(r) for r in part] for split, part in rows.items()}
  assert formats.describe_schema(source).startswith('verl')
  for split, part in rows.items():  # every other field, for users' reward functions
    for record, row in zip(got[split], part):
      kept = json.loads(record['row'])
      assert 'prompt' not in kept and kept['reward_model'] == row['reward_model']
  # A single file is split 'train'.
  single = formats.detect(str(tmp_path / 'test.parquet'))
  assert single.splits == {'train': (str(tmp_path / 'test.parquet'),)}


def test_gsm8k_keeps_its_worked_solution_and_verl_answer(tmp_path):
  path = write_parquet(tmp_path / 'gsm.parquet', gsm8k_rows('train', 2))
  first = formats.read_files('parquet', [path])[0]
  assert first['answer'] == '1000'  # verl's ground truth, commas already removed
  assert first['solution'].endswith('#### 1,000') and GSM8K_INSTRUCTION in first['prompt']


def test_a_conversation_keeps_its_messages(tmp_path):
  messages = [{
      'role': 'system',
      'content': 'Answer briefly.'
  }, {
      'role': 'user',
      'content': 'What is 2+2?'
  }]
  path = write_parquet(tmp_path / 'sys.parquet', [{
      'prompt': messages,
      'reward_model': {
          'style': 'rule',
          'ground_truth': '4'
      }
  }])
  (record,) = formats.read_files('parquet', [path])
  assert record['prompt'] == 'Answer briefly.\n\nWhat is 2+2?' and record['answer'] == '4'
  prompt = examples.as_example(record)['prompt']
  assert isinstance(prompt, examples.Conversation) and prompt.messages == messages
  assert prompt == record['prompt']  # as a str: the plain text
  suffixed = prompt + ' Think.'
  assert isinstance(suffixed, examples.Conversation) and suffixed == record['prompt'] + ' Think.'
  assert suffixed.messages[-1]['content'] == 'What is 2+2? Think.'
  assert suffixed.messages[0] == messages[0] and prompt.messages == messages  # prompt unchanged
  restored = pickle.loads(pickle.dumps(suffixed))
  assert isinstance(restored, examples.Conversation) and restored.messages == suffixed.messages
  # One user message is a plain question, as JSONL's.
  assert examples.as_example({
      'prompt': 'q',
      'answer': 'a',
      'messages': ''
  }) == {
      'prompt': 'q',
      'answer': 'a'
  }


def test_a_saved_hf_dataset_reads_back_as_written(tmp_path):
  datasets = pytest.importorskip('datasets', reason='datasets writes the save_to_disk layout')
  qa = {'question': ['1+1?', '2+3?'], 'answer': ['so #### 2', '\\boxed{5}']}
  datasets.Dataset.from_dict(qa).save_to_disk(str(tmp_path / 'qa'))
  source = formats.detect(str(tmp_path / 'qa'))
  assert source.format == 'arrow' and list(source.splits) == ['train']
  assert core(formats.read_source(source)) == {
      'train': [{
          'prompt': q,
          'answer': formats.normalize_reference_answer(a),
          'solution': a,
          'messages': '',
          'data_source': ''
      } for q, a in zip(qa['question'], qa['answer'])]
  }
  rows = {split: gsm8k_rows(split, n) for split, n in (('train', 3), ('test', 2))}
  datasets.DatasetDict({
      split: datasets.Dataset.from_list(part) for split, part in rows.items()
  }).save_to_disk(str(tmp_path / 'verl'))
  source = formats.detect(str(tmp_path / 'verl'))
  assert source.format == 'arrow' and sorted(source.splits) == ['test', 'train']
  got = formats.read_source(source)
  assert core(got) == {split: [expected_verl(r) for r in part] for split, part in rows.items()}


def test_jsonl_with_named_fields(tmp_path):
  rows = [{
      'instruction': f'Add {i} and 1.',
      'target': str(i + 1),
      'question': 'decoy'
  } for i in range(3)]
  path = write_jsonl(tmp_path / 'custom.jsonl', rows)
  got = formats.read_files('jsonl', [path], question_field='instruction', answer_field='target')
  assert [(r['prompt'], r['answer']) for r in got] == [(r['instruction'], r['target']) for r in rows
                                                      ]
  # Without the names, the default fields are looked for: 'question' is found, no answer field.
  with pytest.raises(
      ValueError, match=r"custom\.jsonl:1: no answer field among \['answer', "
      r"'solution', 'response'\] \(name it with config\.data\.answer_field "
      r'\(jtc data --answer-field\)\)'):
    formats.read_files('jsonl', [path])
  # Naming a field reads a verl file as question/answer rows.
  verl = write_parquet(tmp_path / 'v.parquet', [{**math_rows('train', 1)[0], 'q': 'x', 'a': '1'}])
  assert formats.read_files('parquet', [verl], question_field='q',
                            answer_field='a')[0]['answer'] == '1'


def _with(rows, i, **changes):
  rows = [json.loads(json.dumps(r)) for r in rows]
  for dotted, value in changes.items():
    node, *path = [rows[i]] + dotted.split('.')
    for key in path[:-1]:
      node = node[int(key)] if isinstance(node, list) else node[key]
    node[path[-1]] = value
  return rows


NOT_UTF8 = pa.array([b'fine', b'caf\xe9'], pa.binary()).view(pa.string())

MALFORMED = {
    'verl ground truth empty': (lambda t: write_parquet(
        t / 'e.parquet', _with(gsm8k_rows('train', 3), 2, **{'reward_model.ground_truth': ' '})),
                                r"e\.parquet: row 2: field 'reward_model\.ground_truth' is empty"),
    'verl message content missing': (lambda t: write_parquet(
        t / 'c.parquet', _with(math_rows('train', 3), 1, **{'prompt.0.content': None})),
                                     r"c\.parquet: row 1: field 'prompt\[0\]\.content' must be a "
                                     'string, got NoneType'),
    'verl unknown role': (lambda t: write_parquet(
        t / 'r.parquet', _with(dapo_rows('train', 2), 1, **{'prompt.0.role': 'robot'})),
                          r"r\.parquet: row 1: field 'prompt\[0\]\.role' is 'robot'; valid"),
    'verl without reward_model': (lambda t: write_parquet(t / 'n.parquet', [{
        k: v for k, v in r.items() if k != 'reward_model'
    } for r in gsm8k_rows('train', 2)]), r"n\.parquet: row 0: no answer field.*needs 'reward_model'"
                                 ),
    'parquet not UTF-8': (
        lambda t: write_table(t / 'u.parquet', pa.table({
            'question': NOT_UTF8,
            'answer': ['1', '2']
        })), r"u\.parquet: row 1: field 'question' is not UTF-8"),
    'jsonl not UTF-8': (lambda t: write_bytes(
        t / 'u.jsonl',
        b'{"question": "ok", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n'),
                        r"u\.jsonl:2: field 'question' is not UTF-8"),
    'jsonl answer of the wrong type': (lambda t: write_jsonl(t / 'w.jsonl', [{
        'question': 'a',
        'answer': '1'
    }, {
        'question': 'b',
        'answer': [2]
    }]), r"w\.jsonl:2: field 'answer' must be a string or number"),
    'jsonl empty answer': (lambda t: write_jsonl(t / 'x.jsonl', [{
        'q': 'a',
        'a': ''
    }]), r"x\.jsonl:1: field 'a' is empty"),
    'jsonl missing field': (lambda t: write_jsonl(t / 'm.jsonl', [{
        'q': 'a',
        'a': '1'
    }, {
        'q': 'b'
    }]), r"m\.jsonl:2: no answer field 'a' \(named by config\.data\.answer_field"),
}


@pytest.mark.parametrize('case', MALFORMED)
def test_a_malformed_row_names_file_row_and_field(tmp_path, case):
  write, message = MALFORMED[case]
  path = write(tmp_path)
  fields = {'question_field': 'q', 'answer_field': 'a'} if '/x.' in path or '/m.' in path else {}
  source = formats.detect(path)
  with pytest.raises(ValueError, match=message):
    formats.read_source(source, **fields)


def test_the_format_is_detected_or_named(tmp_path):
  assert formats.detect(write_jsonl(tmp_path / 'data.txt', [{
      'question': 'q',
      'answer': '1'
  }])).format == 'jsonl'
  assert formats.detect(write_parquet(tmp_path / 'noext', gsm8k_rows('t', 1))).format == 'parquet'
  (tmp_path / 'fake.parquet').write_text('{"question": "q"}\n')
  with pytest.raises(ValueError, match=r'fake\.parquet: not a parquet file'):
    formats.detect(str(tmp_path / 'fake.parquet'))
  mixed = tmp_path / 'mixed'
  mixed.mkdir()
  write_jsonl(mixed / 'train.jsonl', [{'question': 'q', 'answer': '1'}])
  write_parquet(mixed / 'test.parquet', gsm8k_rows('test', 1))
  with pytest.raises(ValueError, match='both .jsonl and .parquet files'):
    formats.detect(str(mixed))
  (tmp_path / 'empty').mkdir()
  with pytest.raises(ValueError, match='no data files.*save_to_disk'):
    formats.detect(str(tmp_path / 'empty'))
  with pytest.raises(ValueError, match='dataset not found'):
    formats.detect(str(tmp_path / 'nope'))
  (tmp_path / 'blank.jsonl').write_text('\n \n')
  with pytest.raises(ValueError, match='empty dataset'):
    formats.read_source(formats.detect(str(tmp_path / 'blank.jsonl')))


def test_normalize_reference_answer():
  assert formats.normalize_reference_answer('3+1000=1003\n#### 1,003') == '1003'
  assert formats.normalize_reference_answer('#### Bob') == 'Bob'
  assert formats.normalize_reference_answer('It is $\\boxed{\\frac{1}{2}}$.') == '\\frac{1}{2}'
  assert formats.normalize_reference_answer('  7 ') == '7'
