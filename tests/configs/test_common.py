"""Tests of configs/common.py: method configs differ only in the method, `set_loss` exposes exactly
the loss's hyper-parameters, and a config argument typo is named."""
import glob
import importlib
import os

import pytest

from configs import common
from jtc import checks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(method, arg='smoke'):
  return importlib.import_module(f'configs.{method}').get_config(arg)


_METHOD_KEYS = ('loss.', 'delta.', 'token_weights', 'advantage.')  # Dr. GRPO: advantage


@pytest.mark.parametrize('family', ['configs', 'configs.real'])
def test_method_configs_differ_only_in_the_method(family):
  """A comparison between two method configs compares methods: every other key is equal."""
  folder = os.path.join(REPO, *family.split('.'))
  names = sorted(
      os.path.basename(p)[:-3]
      for p in glob.glob(os.path.join(folder, '*.py'))
      if os.path.basename(p) not in ('__init__.py', 'common.py',
                                     'base.py') and not os.path.basename(p).startswith('sft_'))
  if family == 'configs.real':  # one model and dataset per family of real configs
    names = [n for n in names if n.startswith('qwen3_8b_math')]
  flat = {
      n: checks.flatten(importlib.import_module(f'{family}.{n}').get_config(None).to_dict())
      for n in names
  }
  differing = {}
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      keys = sorted(k for k in set(flat[a]) | set(flat[b])
                    if flat[a].get(k) != flat[b].get(k) and not k.startswith(_METHOD_KEYS))
      if keys:
        differing[f'{a} vs {b}'] = keys
  assert len(names) >= 2
  assert not differing, differing


def test_set_loss_rejects_unknown_hparam():
  c = common.get_config()
  with pytest.raises(ValueError, match='not_a_knob'):
    common.set_loss(c, 'gspo', not_a_knob=1.0)


def test_config_arg_typo_is_rejected():
  with pytest.raises(ValueError, match='smok'):
    _config('grpo', 'smok')
