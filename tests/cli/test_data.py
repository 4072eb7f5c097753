"""Tests of jtc.cli.data (`jtc data PATH`, `python -m jtc.data PATH`): what it prints is what was
written to the file (format, row count, the first pairs), and a malformed row is one error line
naming the file, the row and the field, exit status 2."""
import ast
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jtc import cli
from jtc.cli import data
from tests.data import test_formats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pairs(out):
  """(prompt, answer) pairs printed, read back with the repr they were printed with."""
  lines = out.splitlines()
  return [(ast.literal_eval(p.split('prompt: ', 1)[1]), ast.literal_eval(a.split('answer: ', 1)[1]))
          for p, a in zip(lines, lines[1:])
          if p.lstrip().startswith('[') and 'prompt: ' in p]


def test_a_verl_parquet_file_is_shown_as_written(tmp_path, capsys):
  rows = test_formats.gsm8k_rows('train', 5)
  path = str(tmp_path / 'train.parquet')
  pq.write_table(pa.Table.from_pylist(rows), path)
  assert cli.main(['data', path, '--show', '2']) == 0
  out = capsys.readouterr().out
  assert 'format: parquet' in out and 'rows: verl' in out and 'split train: 5 rows' in out
  assert _pairs(out) == [
      (r['prompt'][0]['content'], r['reward_model']['ground_truth']) for r in rows[:2]
  ]


def test_jsonl_with_named_fields_is_shown_as_written(tmp_path, capsys):
  rows = [{'instruction': f'Add {i} and 2.', 'target': f'#### {i + 2}'} for i in range(4)]
  path = tmp_path / 'custom.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  argv = [str(path), '--show', '9', '--question-field', 'instruction', '--answer-field', 'target']
  assert data.main(argv) == 0
  out = capsys.readouterr().out
  assert "question field 'instruction', answer field 'target'" in out and '4 rows' in out
  assert _pairs(out) == [(r['instruction'], str(i + 2)) for i, r in enumerate(rows)]


def test_a_list_and_glob_of_files_is_one_split_in_the_order_named(tmp_path, capsys):
  for name, n in (('part-1.jsonl', 1), ('part-0.jsonl', 2), ('extra.jsonl', 1)):
    (tmp_path / name).write_text(''.join(
        json.dumps({
            'question': f'{name}:{i}',
            'answer': '#### 1'
        }) + '\n' for i in range(n)))
  assert data.main([f'{tmp_path}/part-*.jsonl,{tmp_path}/extra.jsonl', '--show', '9']) == 0
  out = capsys.readouterr().out
  assert 'split train: 4 rows' in out
  assert [p for p, _ in _pairs(out)
         ] == ['part-0.jsonl:0', 'part-0.jsonl:1', 'part-1.jsonl:0', 'extra.jsonl:0']
  with pytest.raises(SystemExit):  # a pattern that matches nothing: one line naming it
    data.main([f'{tmp_path}/none-*.jsonl'])
  err = capsys.readouterr().err
  assert "none-*.jsonl' matches no file" in err


def test_a_saved_hf_dataset_is_shown_as_written(tmp_path):
  datasets = pytest.importorskip('datasets', reason='datasets writes the save_to_disk layout')
  qa = {'problem': ['1+1?', '2+2?', '3+3?'], 'solution': ['\\boxed{2}', '\\boxed{4}', '\\boxed{6}']}
  datasets.DatasetDict({
      'train': datasets.Dataset.from_dict(qa),
      'test': datasets.Dataset.from_dict({
          k: v[:1] for k, v in qa.items()
      })
  }).save_to_disk(str(tmp_path / 'hf'))
  proc = subprocess.run([sys.executable, '-m', 'jtc.data',
                         str(tmp_path / 'hf'), '--show', '3'], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=True)
  assert 'save_to_disk' in proc.stdout and 'split train: 3 rows' in proc.stdout
  # The splits in dataset_dict.json's order: train, then test.
  assert _pairs(proc.stdout) == [('1+1?', '2'), ('2+2?', '4'), ('3+3?', '6'), ('1+1?', '2')]


def test_a_malformed_row_is_one_error_naming_file_row_and_field(tmp_path, capsys):
  rows = test_formats.math_rows('train', 3)
  rows[2]['reward_model']['ground_truth'] = ''
  path = str(tmp_path / 'math.parquet')
  pq.write_table(pa.Table.from_pylist(rows), path)
  with pytest.raises(SystemExit) as exit_info:
    data.main([path])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.endswith(f"{path}: row 2: field 'reward_model.ground_truth' is empty"), err


def test_with_a_config_it_shows_the_prompt_as_the_model_reads_it_and_the_traps(tmp_path, capsys):
  """The GSM8K trap before a run: a prompt that asks for '####' gets a \\boxed{} suffix too, and
  boxed_numeric scores the reference solution '... #### 4' as 0; both are warned."""
  path = tmp_path / 'gsm.jsonl'
  path.write_text(
      json.dumps({
          'question': 'Tom has 3 apples. Output the final answer after "####".',
          'answer': '3+1=4\n#### 4'
      }) + '\n')
  assert data.main([
      str(path), '--show', '1', '--config', 'configs/gspo.py',
      '--config.data.prompt_suffix= Put the final answer in \\boxed{}.',
      '--config.data.reward=boxed_numeric'
  ]) == 0
  out = capsys.readouterr().out
  assert 'Tom has 3 apples. Output the final answer after "####". Put the final answer in' in out
  assert 'tokens; config.data.prompt_width=20: DOES NOT FIT' in out
  assert "the verifier scores the reference solution '3+1=4\\n#### 4': 0" in out
  assert out.count('warning:') == 2
  capsys.readouterr()
  assert data.main([  # the fixes: no suffix, verl's rule; a wide prompt
      str(path), '--show', '1', '--config', 'configs/gspo.py', '--config.data.prompt_suffix=',
      '--config.data.reward=gsm8k_strict', '--config.data.prompt_width=80'
  ]) == 0
  out = capsys.readouterr().out
  assert ': fits' in out and 'warning' not in out and "'3+1=4\\n#### 4': 1" in out
