"""docs/from_verl_trl.md, the verl / TRL -> jtc key map: every jtc key its tables name is a key
of the configs (configs/common.py's, the loss hyper-parameters of the losses it names), so the
map cannot point at a key that does not exist."""
import os
import re

import pytest

from configs import common
from jtc import checks
from jtc import objectives

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r'^\| (`[^|]+`[^|]*) \| (`[\w.]+`|\(`--\w+`\)) \|')


def jtc_keys(text):
  """The jtc keys (second column) of the markdown table rows of ``text``."""
  return [m[2].strip('`') for m in map(ROW.match, text.splitlines()) if m and m[2][0] == '`']


def valid_keys():
  keys = set(checks.flatten(common.get_config().to_dict()))
  for name in objectives.LOSSES:  # every loss's hyper-parameters
    keys |= {f'loss.hparams.{k}' for k in objectives.default_hparams(name)}
  return keys


def test_the_rows_are_read():
  text = '| verl | jtc | note |\n|---|---|---|\n| `a.b` | `optim.lr_x` | n |\n| `w` | (`--workdir`) | |'
  assert jtc_keys(text) == ['optim.lr_x']


def test_every_jtc_key_of_the_map_exists():
  with open(os.path.join(REPO, 'docs', 'from_verl_trl.md')) as f:
    keys = jtc_keys(f.read())
  assert len(keys) > 50
  missing = sorted(set(keys) - valid_keys())
  assert not missing, f'docs/from_verl_trl.md names keys no config has: {missing}'


def test_a_made_up_key_would_be_caught():
  with pytest.raises(AssertionError):
    assert 'optim.made_up' in valid_keys()
