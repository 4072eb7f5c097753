"""Tests for jtc.data.file_lists: lists and glob patterns of files, expanded in the order named
(each pattern's matches sorted); an existing path is never a pattern; every bad item is named."""
import os

import pytest

from jtc.data import file_lists


def _touch(path):
  path.write_text('{}\n')
  return str(path)


def test_items_in_the_order_named_patterns_sorted(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for name in ('b-1.jsonl', 'b-0.jsonl', 'a.jsonl', 'c.parquet'):
    _touch(tmp_path / name)
  assert file_lists.expand('b-*.jsonl,a.jsonl') == tuple(
      str(tmp_path / n) for n in ('b-0.jsonl', 'b-1.jsonl', 'a.jsonl'))
  assert file_lists.expand(' a.jsonl , c.parquet') == (str(tmp_path / 'a.jsonl'),
                                                       str(tmp_path / 'c.parquet'))
  assert file_lists.is_list('a.jsonl,c.parquet') and file_lists.is_list('b-*.jsonl')
  assert not file_lists.is_list('a.jsonl')


def test_an_existing_path_is_that_file_not_a_list(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _touch(tmp_path / 'odd,name[1].jsonl')
  _touch(tmp_path / 'odd')
  assert not file_lists.is_list('odd,name[1].jsonl')
  assert file_lists.is_list('odd,name[2].jsonl')


@pytest.mark.parametrize('spec, message', [
    ('a.jsonl,nope.jsonl', r"'nope.jsonl' is not found"),
    ('z-*.jsonl', r"'z-\*.jsonl' matches no file"),
    ('a.jsonl,,a2.jsonl', 'an empty item'),
    ('a.jsonl,*.jsonl', r'names .*a\.jsonl twice'),
    ('sub,a.jsonl', r'sub is a directory; a list names files'),
])
def test_a_bad_item_is_named(tmp_path, monkeypatch, spec, message):
  monkeypatch.chdir(tmp_path)
  _touch(tmp_path / 'a.jsonl')
  os.mkdir(tmp_path / 'sub')
  with pytest.raises(ValueError, match=message):
    file_lists.expand(spec)
