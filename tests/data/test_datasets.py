"""Tests of jtc.data.datasets: a dataset is prepared once, concurrent preparers on a fresh
directory agree, neither generating nor reading prints download chatter, a malformed dataset fails
before preparation, and the field names key the prepared data."""
import glob
import json
import os
import subprocess
import sys

import pytest

from jtc.data import datasets
from jtc.data.tasks import get_task

SIZES = {'train': 48, 'test': 12}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_built_once(data_dir):
  datasets.prepare('arithmetic', data_dir=data_dir, num_examples=SIZES)
  files = sorted(
      glob.glob(os.path.join(data_dir, 'arithmetic-*', '**', '*.array_record*'), recursive=True))
  assert files
  stamps = [os.stat(f).st_mtime_ns for f in files]
  datasets.prepare('arithmetic', data_dir=data_dir, num_examples=SIZES)
  assert [os.stat(f).st_mtime_ns for f in files] == stamps
  # a different config gets its own folder
  datasets.prepare('arithmetic', data_dir=data_dir, num_examples=SIZES, task_kwargs={'ops': ['*']})
  assert len(glob.glob(os.path.join(data_dir, 'arithmetic-*'))) == 2


_PREPARE_SCRIPT = r"""
import contextlib, json, os, sys, time
barrier, index, count, data_dir, unlocked = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
from jtc.data import datasets, pipeline
if unlocked:  # exercise the FileExistsError tolerance that covers file systems without flock
    datasets._file_lock = lambda path: contextlib.nullcontext()
open(os.path.join(barrier, f"ready_{index}"), "w").close()
deadline = time.time() + 300
while len(os.listdir(barrier)) < count and time.time() < deadline:  # all imported: go together
    time.sleep(0.005)
got = {split: pipeline.load_examples("arithmetic", split=split, data_dir=data_dir, num_examples={"train": 40, "test": 10})
       for split in ("train", "test")}
print("RESULT " + json.dumps(got, sort_keys=True))
"""

_CHATTER = ('download', 'prepared', 'variant folder', '%|', 'generating', 'shuffling')


def _run_preparers(tmp_path, data_dir, count, *, unlocked=False):
  """Starts `count` processes that prepare + read the same dataset at the same moment."""
  barrier = tmp_path / f'barrier_{unlocked}'
  barrier.mkdir()
  env = {
      **os.environ, 'PYTHONPATH': os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]),
      'JAX_PLATFORMS': 'cpu'
  }
  procs = [
      subprocess.Popen([
          sys.executable, '-c', _PREPARE_SCRIPT,
          str(barrier),
          str(i),
          str(count), data_dir, '1' if unlocked else '0'
      ], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(count)
  ]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return outs


def _results(outs):
  return [
      json.loads(next(l
                      for l in out.splitlines()
                      if l.startswith('RESULT '))[len('RESULT '):])
      for out, _ in outs
  ]


@pytest.mark.parametrize('unlocked', [False, True], ids=['flock', 'no_lock_rename_race'])
def test_concurrent_prepare_on_a_fresh_dir(tmp_path, unlocked):
  data_dir = str(tmp_path / 'fresh')
  outs = _run_preparers(tmp_path, data_dir, 4, unlocked=unlocked)
  results = _results(outs)
  want = {
      split: get_task('arithmetic').examples(split, seed=0, num_examples=n) for split, n in {
          'train': 40,
          'test': 10
      }.items()
  }
  assert all(r == want for r in results)  # every process read the same, complete examples
  folders = glob.glob(os.path.join(data_dir, 'arithmetic-*'))
  assert len(folders) == 1
  versions = glob.glob(os.path.join(folders[0], 'jtc_synthetic', '1.0.0'))
  assert len(versions) == 1 and os.path.isfile(os.path.join(versions[0], 'dataset_info.json'))
  if not unlocked:  # with the lock, only one process generated: no stray incomplete folders
    assert not glob.glob(os.path.join(folders[0], 'jtc_synthetic', 'incomplete.*'))
  assert not glob.glob(os.path.join(data_dir, '.*.lock'))  # the lock files went with the locks


def test_no_download_chatter_when_generating_or_reading(tmp_path):
  data_dir = str(tmp_path / 'quiet')
  for attempt in ('generate', 'read'):  # the first run builds the files, the second reads them
    (tmp_path / attempt).mkdir()
    [(out, err)] = _run_preparers(tmp_path / attempt, data_dir, 1)
    text = (out + err).lower()
    assert not [w for w in _CHATTER if w in text], (attempt, out, err)
    assert [l for l in out.splitlines() if l.strip()
           ] == [l for l in out.splitlines() if l.startswith('RESULT ')]
  assert glob.glob(
      os.path.join(data_dir, 'arithmetic-*', 'jtc_synthetic', '1.0.0', 'dataset_info.json'))


def test_a_malformed_dataset_fails_before_preparation(tmp_path):
  """Every row is checked before TFDS starts: nothing (not even the lock file) is left behind."""
  path = tmp_path / 'bad.jsonl'
  path.write_text(''.join(
      json.dumps({
          'question': f'q{i}',
          'answer': '' if i == 3 else str(i)
      }) + '\n' for i in range(5)))
  data_dir = tmp_path / 'cache'
  data_dir.mkdir()
  with pytest.raises(ValueError, match=r"bad\.jsonl:4: field 'answer' is empty"):
    datasets.prepare(str(path), data_dir=str(data_dir))
  assert os.listdir(data_dir) == []


def test_the_field_names_key_the_prepared_data(tmp_path, data_dir):
  path = tmp_path / 'fields.jsonl'
  path.write_text(''.join(
      json.dumps({
          'question': f'q{i}',
          'task': f't{i}',
          'answer': str(i),
          'label': str(10 * i)
      }) + '\n' for i in range(3)))
  kwargs = dict(split='train', data_dir=data_dir)
  default = [datasets.decode(r) for r in datasets.data_source(str(path), **kwargs)]
  named = [
      datasets.decode(r) for r in datasets.data_source(str(path), question_field='task',
                                                       answer_field='label', **kwargs)
  ]
  assert [(r['prompt'], r['answer']) for r in default] == [(f'q{i}', str(i)) for i in range(3)]
  assert [(r['prompt'], r['answer']) for r in named] == [(f't{i}', str(10 * i)) for i in range(3)]
  assert len(glob.glob(os.path.join(data_dir, 'jsonl_fields_jsonl-*'))) == 2
