"""Every subpackage of jtc declares its public names (`__all__`): each one imports, and every
module of the package is listed, so `__all__` is the package's table of contents."""
import importlib
import os
import pkgutil

import pytest

import jtc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subpackages():
  return sorted(m.name for m in pkgutil.walk_packages(jtc.__path__, 'jtc.') if m.ispkg)


def unlisted_modules(package):
  """Modules and subpackages of ``package`` (public names) that its ``__all__`` leaves out."""
  listed = set(getattr(package, '__all__', ()))
  return sorted(m.name
                for m in pkgutil.iter_modules(package.__path__)
                if not m.name.startswith('_') and m.name not in listed)


def test_the_subpackages_are_found():
  assert {
      'jtc.objectives', 'jtc.models', 'jtc.data', 'jtc.data.tasks', 'jtc.rl', 'jtc.analysis',
      'jtc.cli'
  } <= set(subpackages())


def test_a_package_without_all_lists_nothing(tmp_path, monkeypatch):
  """Known positive: a package whose __all__ misses a module is caught."""
  (tmp_path / 'pkg').mkdir()
  (tmp_path / 'pkg' / '__init__.py').write_text("__all__ = ['a']\n")
  (tmp_path / 'pkg' / 'a.py').write_text('')
  (tmp_path / 'pkg' / 'b.py').write_text('')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert unlisted_modules(importlib.import_module('pkg')) == ['b']


@pytest.mark.parametrize('name', subpackages())
def test_each_subpackage_declares_all_its_public_names(name):
  package = importlib.import_module(name)
  assert hasattr(package, '__all__'), f'{name} declares no __all__'
  for public in package.__all__:
    assert hasattr(package, public) or importlib.import_module(f'{name}.{public}'), public
  assert not unlisted_modules(package), f'{name}.__all__ leaves out {unlisted_modules(package)}'
