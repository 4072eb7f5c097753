"""What a run did: step diagnostics, offline probes, curve statistics, metric files, plots."""


def __getattr__(name):
  """jtc 0.1's `jtc.analysis.<function>` (now `jtc.analysis.probes`), kept for one release."""
  import importlib  # pylint: disable=import-outside-toplevel
  import warnings  # pylint: disable=import-outside-toplevel
  probes = importlib.import_module('jtc.analysis.probes')
  if not hasattr(probes, name):
    raise AttributeError(f'module jtc.analysis has no attribute {name!r}')
  warnings.warn(f'jtc.analysis.{name} moved to jtc.analysis.probes.{name}', DeprecationWarning,
                stacklevel=2)
  return getattr(probes, name)
