"""jtc.interop.rollouts: group advantages equal verl's GRPO (torch) and the other estimators'
definitions; groups are laid out contiguously and padded; per-token fields refuse ragged lists and
keep a writer's null as NaN."""
import math

import numpy as np
import pytest

from jtc.interop import rollouts as rl
from tests.interop import writers


def test_group_advantages_are_verls_grpo_and_the_estimators_definitions():
  r = [1.0, 0.0, 0.0, 1.0, 1.0]
  np.testing.assert_allclose(rl.group_advantages(r, 'grpo'), writers.verl_grpo(r, [0] * 5),
                             rtol=1e-6)
  np.testing.assert_allclose(rl.group_advantages(r, 'dr_grpo'), np.array(r) - 0.6)
  loo = [x - (sum(r) - x) / 4 for x in r]
  np.testing.assert_allclose(rl.group_advantages(r, 'rloo'), loo)
  assert not rl.group_advantages([1.0, 1.0], 'grpo').any()  # a degenerate group: exactly 0
  with pytest.raises(ValueError, match="--advantage 'ppo' is not valid"):
    rl.group_advantages(r, 'ppo')


def _rollout(group, n, **kw):
  return rl.Rollout(where='f:1', step=0, group=group, prompt_ids=[1] * (group + 1),
                    completion_ids=[2] * n, mask=[1.0] * n, advantage=0.5, **kw)


def test_groups_are_contiguous_padded_and_laid_out_left_and_right():
  rows, G = rl.arrange(
      [_rollout(0, 2),
       _rollout(1, 3),
       _rollout(0, 1),
       _rollout(1, 2),
       _rollout(1, 1)])
  assert G == 3 and [None if r is None else r.group for r in rows] == [0, 0, None, 1, 1, 1]
  cols = rl.arrays(rows)
  assert cols['prompt_mask_BP'].tolist()[0] == [0, 1] and cols['prompt_BP'].shape == (6, 2)
  assert cols['completion_mask_BT'][:, :].sum(-1).tolist() == [2, 1, 0, 3, 2, 1]
  real = cols['completion_mask_BT'] > 0
  assert np.isnan(cols['logps_BT'][real]).all() and not np.isnan(cols['logps_BT'][~real]).any()
  assert np.isnan(cols['rewards_B']).all() and 'ref_logps_BT' not in cols


def test_per_token_fields():
  assert math.isnan(rl.floats([None, 1], 'x', 'f:3', 2)[0])
  with pytest.raises(rl.DumpError, match="f:3: field 'x': ragged: 1 values for 2 tokens"):
    rl.floats([1.0], 'x', 'f:3', 2)
  with pytest.raises(rl.DumpError, match="f:3: field 'x': 'a' is not a number"):
    rl.floats(['a'], 'x', 'f:3', 1)
  with pytest.raises(rl.DumpError, match="f:3: field 'r': missing"):
    rl.require({'s': 1}, 'r', 'f:3')
