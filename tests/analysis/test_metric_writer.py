"""Tests of jtc.analysis.metric_writer: one record per step after a resume, values as JSON
(non-finite floats as strings), a torn last line ignored, a population's member directories in
member order, and a writer that is not process 0 writing nothing."""
import json
import os

import numpy as np

from jtc.analysis import metric_writer


def test_a_resume_drops_the_steps_it_recomputes(tmp_path):
  writer = metric_writer.MetricWriter(str(tmp_path))
  for step in range(4):
    writer.write(step, {'loss': np.float32(step), 'v': np.array([1, 2]), 'bad': float('nan')})
  writer.close()
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 4, "lo')  # a kill in the middle of a line
  records = metric_writer.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1, 2, 3]
  assert records[1] == {'step': 1, 'loss': 1.0, 'v': [1, 2], 'bad': 'nan'}
  again = metric_writer.MetricWriter(str(tmp_path), resume_step=2)
  again.write(2, {'loss': 2.0})
  again.close()
  steps = [r['step'] for r in metric_writer.read_jsonl(str(tmp_path / 'metrics.jsonl'))]
  assert steps == [0, 1, 2]
  assert metric_writer.last_record(str(tmp_path)) == {'step': 2, 'loss': 2.0}


def test_a_writer_without_files_writes_nothing(tmp_path):
  writer = metric_writer.MetricWriter(str(tmp_path / 'w'), files=False)
  assert writer.write(3, {'x': 1}) == {'step': 3, 'x': 1}
  writer.close()
  assert not os.path.exists(tmp_path / 'w')
  assert metric_writer.last_record(str(tmp_path / 'w')) == {}


def test_run_dirs_are_a_populations_members_in_member_order(tmp_path):
  assert metric_writer.run_dirs(str(tmp_path)) == [str(tmp_path)]
  for index, name in ((1, 'seed1'), (0, 'seed0'), (2, 'seed10')):
    os.makedirs(tmp_path / 'members' / name)
    with open(tmp_path / 'members' / name / 'member.json', 'w') as f:
      json.dump({'index': index}, f)
  assert metric_writer.run_dirs(
      str(tmp_path)) == [str(tmp_path / 'members' / n) for n in ('seed0', 'seed1', 'seed10')]
