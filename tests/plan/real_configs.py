"""Real configs shrunk for the planner's tests (2 layers), and their abstract step on a deviceless v5e:2x2
(libtpu)."""
import importlib.util
import os

import jax
import pytest

from jtc.cli import absl_program
from jtc.models import model as model_lib

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None, reason='libtpu (the plan extra) is not installed')


def config(path='configs/real/qwen3_0_6b_gsm8k_dfpo.py', model=None, **overrides):
  """A real config with 2 layers (and the ``model`` ModelConfig overrides)."""
  from jtc.plan import suggest  # pylint: disable=import-outside-toplevel
  c = absl_program.load_config(os.path.join(absl_program.REPO, path))
  c = suggest.apply(c, overrides)
  with c.policy.overrides.ignore_type():
    for k, v in {'n_layers': 2, **(model or {})}.items():
      c.policy.overrides[k] = v
  return c


def step(c):
  """The trainer's abstract step of ``c`` on a deviceless v5e:2x2."""
  from jtc.plan import hardware, planner  # pylint: disable=import-outside-toplevel
  return planner.build_step(c, hardware.topology_devices('v5e:2x2'), 'tpu')


def n_params(s):
  return model_lib.num_params(
      jax.eval_shape(lambda: model_lib.init_params(s.model_config, jax.random.key(0))))
