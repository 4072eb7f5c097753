"""Tests for jtc.analysis.samples and the metric writer's sample generations: the records of a
rollout (one completion per prompt, its reward, answer and data_source), the steps that log them,
and a resumed run holding each step's samples once."""
import numpy as np

from configs import common
from jtc.analysis import metric_writer
from jtc.analysis import samples
from jtc.data import examples
from jtc.rl import rollout as rollout_lib


def rollout(n_prompts, G, step=0):
  """A rollout of ``n_prompts`` groups of G rows: rewards (row / 10 + step), texts, prompts and
  answers (data_source s0 / s1) that name their rows."""
  B = n_prompts * G
  zeros = np.zeros((B, 2), np.int32)
  return rollout_lib.Rollout(
      tokens_BL=zeros, input_mask_BL=zeros, completion_BT=zeros, completion_mask_BT=zeros,
      sampler_logps_BT=zeros.astype(np.float32), truncated_B=np.zeros(B, bool),
      rewards_B=np.arange(B, dtype=np.float32) / 10 + step, texts=tuple(f'c{i}' for i in range(B)),
      prompts=tuple(f'p{b}' for b in range(n_prompts) for _ in range(G)), answers=tuple(
          examples.Reference(f'a{b}', data_source=f's{b % 2}')
          for b in range(n_prompts)
          for _ in range(G)))


def test_one_completion_of_each_of_the_first_prompts():
  got = samples.records(rollout(3, G=4), 7, n=2, group_size=4)
  assert got == [
      dict(step=7, prompt='p0', completion='c0', reward=0.0, answer='a0', data_source='s0'),
      dict(step=7, prompt='p1', completion='c4', reward=np.float32(0.4).item(), answer='a1',
           data_source='s1'),
  ]
  assert len(samples.records(rollout(3, G=4), 7, n=10, group_size=4)) == 3  # all it has
  table = samples.table(got)
  assert table['columns'] == list(samples.COLUMNS) and table['data'][1][:3] == [7, 'p1', 'c4']


def test_the_steps_that_log():
  assert [s for s in range(7) if samples.due(s, 3)] == [0, 3, 6]
  assert not any(samples.due(s, 0) for s in range(7))  # 0: never


def _write(run_dir, steps, *, resume_step, every=2):
  log = common.get_config().log
  log.samples_every, log.samples = every, 2
  writer = metric_writer.MetricWriter(run_dir, resume_step=resume_step, log=log, group_size=2)
  try:
    for step in steps:
      writer.write(step, {'loss': 1.0}, rollout=rollout(3, G=2, step=step))
  finally:
    writer.close()


def test_a_resumed_run_holds_each_steps_samples_once(tmp_path):
  run_dir = str(tmp_path)
  _write(run_dir, range(1, 6), resume_step=0)  # killed after step 5, its checkpoint at step 3
  _write(run_dir, range(4, 7), resume_step=4)
  got = samples.read(run_dir)
  assert [r['step'] for r in got] == [2, 2, 4, 4, 6, 6]
  assert [r['reward'] for r in got[2:4]] == [4.0, np.float32(4.2).item()]  # step 4's, once
  assert metric_writer.read_jsonl(str(tmp_path / 'metrics.jsonl'))[-1]['step'] == 6
  _write(run_dir, [8], resume_step=7, every=0)  # switched off: nothing more
  assert len(samples.read(run_dir)) == 6


def test_other_processes_write_nothing(tmp_path):
  log = common.get_config().log
  log.samples_every = 1
  writer = metric_writer.MetricWriter(str(tmp_path), files=False, log=log, group_size=2)
  writer.write(1, {'loss': 1.0}, rollout=rollout(1, G=2))
  writer.close()
  assert not (tmp_path / samples.FILE).exists()
