"""Tests for jtc.data.selection: the training and held-out rows of a `data` section (named splits,
a dataset's own test split, a seeded held-out fraction that is never trained on, `jtc eval`'s
dataset of one split) and the checks of the split keys before any compute."""
import json

import pytest

from configs import common
from jtc.data import pipeline
from jtc.data import selection


def _data(**overrides):
  c = common.get_config(None).data
  with c.unlocked():
    c.update(dict(task=''), **overrides)
  return c


def _jsonl(path, n, tag=''):
  path.write_text(''.join(
      json.dumps({
          'question': f'{tag}q{i}',
          'answer': str(i)
      }) + '\n' for i in range(n)))
  return str(path)


def test_held_out_split(tmp_path):
  path = _jsonl(tmp_path / 'one.jsonl', 1)
  assert selection.held_out_split(path) == 'train'  # a file: its only split
  splits = tmp_path / 'splits'
  splits.mkdir()
  for split in ('train', 'test', 'validation'):
    _jsonl(splits / f'{split}.jsonl', 1)
  assert selection.held_out_split(str(splits)) == 'test'
  assert selection.held_out_split(str(splits), 'validation') == 'validation'
  with pytest.raises(ValueError, match=r"eval_split='dev' is not a split.*\['test', 'train', "):
    selection.held_out_split(str(splits), 'dev')
  (splits / 'test.jsonl').unlink()
  with pytest.raises(ValueError, match=r"no test split.*\['train', 'validation'\].*eval_split"):
    selection.held_out_split(str(splits))


def test_a_dataset_of_one_split_trains_on_it(tmp_path):
  """A directory holding only dapo-math-17k.parquet trains on that split (it once passed
  `jtc data` and failed in training for want of a 'train' split); several splits without
  'train' are named, and data.train_split picks one."""
  one = tmp_path / 'one'
  one.mkdir()
  _jsonl(one / 'dapo-math-17k.jsonl', 1)
  assert selection.train_split(str(one)) == 'dapo-math-17k'
  _jsonl(one / 'other.jsonl', 1)
  with pytest.raises(ValueError, match=r"no train split.*\['dapo-math-17k', 'other'\]"):
    selection.train_split(str(one))
  assert selection.train_split(str(one), 'other') == 'other'
  with pytest.raises(ValueError, match=r"train_split='x' is not a split.*\['dapo-math-17k', "):
    selection.train_split(str(one), 'x')
  _jsonl(one / 'train.jsonl', 1)
  assert selection.train_split(str(one)) == 'train'


@pytest.mark.parametrize('n, fraction', [(10, 0.2), (7, 0.5), (100, 0.01), (3, 0.1)])
def test_a_fraction_partitions_the_rows_by_its_seed(n, fraction):
  held, trained = selection.fraction_split(n, fraction, seed=0)
  assert sorted(held + trained) == list(range(n))  # disjoint and covering
  assert len(held) == max(1, round(fraction * n))
  assert list(held) == sorted(held) and list(trained) == sorted(trained)
  assert selection.fraction_split(n, fraction, seed=0) == (held, trained)


def test_another_seed_holds_out_other_rows():
  assert selection.fraction_split(100, 0.2,
                                  seed=1)[0] != selection.fraction_split(100, 0.2, seed=0)[0]


def test_a_fraction_that_leaves_nothing_to_train_is_refused():
  with pytest.raises(ValueError, match='eval_fraction=0.9 holds out 2 of the 2 training rows'):
    selection.fraction_split(2, 0.9, seed=0)


def test_a_held_out_fraction_is_never_trained_on(tmp_path):
  """The rows of a file: a held-out fraction and the training rows are complements, the same for
  every run seed, and the iterator of a run yields exactly its training rows."""
  data = _data(dataset=_jsonl(tmp_path / 'all.jsonl', 20), eval_fraction=0.25,
               data_dir=str(tmp_path / 'cache'))
  train, held = selection.train_rows(data), selection.held_out_rows(data)
  assert (train.split, held.split) == ('train', 'train') and len(held.keep) == 5
  assert sorted(train.keep + held.keep) == list(range(20))
  got = pipeline.run_data(data, batch_size=5, seeds=[0, 1], eval_problems=100)
  assert [e['prompt'] for e in got.eval_examples] == [f'q{i}' for i in held.keep]
  for it in got.train_iters:  # one epoch of each member's stream
    seen = {p for _ in range(3) for p in next(it)['prompt']}
    assert seen == {f'q{i}' for i in train.keep}
  assert held.where(0) == f"split 'train' row {held.keep[0]} of {data.dataset!r}"


def test_jtc_eval_holds_out_a_dataset_of_one_split_whole(tmp_path):
  data = _data(dataset=_jsonl(tmp_path / 'test.jsonl', 3))
  assert selection.held_out_rows(data) is None  # training never evaluates on its training rows
  assert selection.held_out_rows(data, whole_dataset=True).split == 'train'
  task = _data(task='arithmetic')
  assert (selection.train_rows(task).split, selection.held_out_rows(task).split) == ('train',
                                                                                     'test')


def test_the_split_keys_are_checked_before_any_compute(tmp_path):
  splits = tmp_path / 'splits'
  splits.mkdir()
  for split in ('train', 'test'):
    _jsonl(splits / f'{split}.jsonl', 2)
  one = _jsonl(tmp_path / 'one.jsonl', 4)
  selection.check_config(_data(dataset=one, eval_fraction=0.5))
  selection.check_config(_data(dataset=str(splits), eval_split='train'))
  bad = [
      (dict(dataset=one, eval_fraction=1.0), r'eval_fraction=1.0 is not valid; valid: 0 <='),
      (dict(dataset=str(splits), eval_fraction=0.1), r"but the dataset's 'test' split is held"),
      (dict(dataset=one, eval_dataset=one, eval_fraction=0.1), r'eval_dataset=.* is held out'),
      (dict(dataset=str(splits), train_split='dev'), r"train_split='dev' is not a split"),
      (dict(dataset=one, eval_dataset=str(splits), eval_split='x'), r"eval_split='x' is not a"),
      (dict(task='arithmetic', train_split='train'), r"train_split='train' needs config.data"),
  ]
  for overrides, message in bad:
    with pytest.raises(ValueError, match=message):
      selection.check_config(_data(**overrides))
