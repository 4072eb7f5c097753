"""jtc: what an intra-group RL objective does to each token, in JAX.

Subpackages, by stage (README "Layout"):
  jtc.objectives  advantages, in-group transforms, per-token surrogates, the loss, DelTA
  jtc.models      model config, decoder, decoding, sampler, Hugging Face import, tokenizers
  jtc.data        synthetic tasks, verifiers, prepared datasets, the grain pipeline
  jtc.rl          rollouts, the update, the trainer, workdirs, checkpoints, sharding, CLI, SFT
  jtc.analysis    step diagnostics, offline probes, curve statistics, metric files, plots

Commands: ``python -m jtc.train``, ``python -m jtc.sft``, ``python -m jtc.plot``.

The flat module paths of jtc 0.1 (``jtc.model``, ``jtc.sampler``, ...) still import, for one
release, as aliases of their new homes (`MOVED`), with a DeprecationWarning.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# jtc 0.1 module -> its home since the subpackages (aliases kept for one release).
MOVED = {
    'jtc.advantages': 'jtc.objectives.advantages',
    'jtc.group_transforms': 'jtc.objectives.group_transforms',
    'jtc.surrogates': 'jtc.objectives.surrogates',
    'jtc.delta': 'jtc.objectives.delta',
    'jtc.delta_geometry': 'jtc.objectives.delta_geometry',
    'jtc.token_weights': 'jtc.objectives.token_weights',
    'jtc.model_config': 'jtc.models.model_config',
    'jtc.model': 'jtc.models.model',
    'jtc.decode': 'jtc.models.decode',
    'jtc.sampler': 'jtc.models.sampler',
    'jtc.hf_import': 'jtc.models.hf_import',
    'jtc.tokenizer': 'jtc.models.tokenizer',
    'jtc.tasks': 'jtc.data.tasks',
    'jtc.rewards': 'jtc.data.rewards',
    'jtc.expressions': 'jtc.data.expressions',
    'jtc.datasets': 'jtc.data.datasets',
    'jtc.rollout': 'jtc.rl.rollout',
    'jtc.update': 'jtc.rl.update',
    'jtc.workdir': 'jtc.rl.workdir',
    'jtc.checkpoints': 'jtc.rl.checkpoints',
    'jtc.sharding': 'jtc.rl.sharding',
    'jtc.cli': 'jtc.rl.cli',
    'jtc.config_check': 'jtc.rl.config_check',
    'jtc.diagnostics': 'jtc.analysis.diagnostics',
    'jtc.curves': 'jtc.analysis.curves',
    'jtc.metric_writer': 'jtc.analysis.metric_writer',
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports a `MOVED` name as the module at its new home (the same module object)."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname not in MOVED:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    warnings.warn(f'{spec.name} moved to {MOVED[spec.name]}; the old path goes in the next release',
                  DeprecationWarning, stacklevel=3)
    return importlib.import_module(MOVED[spec.name])

  def exec_module(self, module):
    pass


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
  sys.meta_path.append(_AliasFinder())
