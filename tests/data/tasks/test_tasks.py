"""Tests of jtc.data.tasks: an unknown task is named with the known ones."""
import pytest

from jtc.data import tasks


def test_get_task_unknown_lists_known():
  with pytest.raises(ValueError, match=r"'nope'.*arithmetic.*countdown"):
    tasks.get_task('nope')
  with pytest.raises(ValueError, match='ops'):
    tasks.get_task('arithmetic', ops=('/',))
