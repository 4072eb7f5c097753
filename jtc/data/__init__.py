"""Prompts and verifiers: synthetic tasks, reward functions, the expression evaluator, prepared datasets, the grain pipeline."""


def __getattr__(name):
  """jtc 0.1's `jtc.data.<function>` (now `jtc.data.pipeline`), kept for one release."""
  import importlib  # pylint: disable=import-outside-toplevel
  import warnings  # pylint: disable=import-outside-toplevel
  pipeline = importlib.import_module('jtc.data.pipeline')
  if not hasattr(pipeline, name):
    raise AttributeError(f'module jtc.data has no attribute {name!r}')
  warnings.warn(f'jtc.data.{name} moved to jtc.data.pipeline.{name}', DeprecationWarning,
                stacklevel=2)
  return getattr(pipeline, name)
