"""Tests of jtc.rl.checkpoints: a training checkpoint restores exactly; an unreadable latest step
is moved aside (never deleted) for the previous one; a step of other shapes is refused and left
as it was; the policy section and the dtype casts. The trainer-level runs of the same (resume
after SIGKILL, another model's checkpoints) are tests/rl/test_trainer.py's and test_workdir.py's."""
import glob
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jtc.rl import checkpoints


def _state(scale=1.0, width=3):
  return {
      'w': scale * jnp.arange(2 * width, dtype=jnp.float32).reshape(2, width),
      'step': jnp.int32(7)
  }


def _save(directory, steps, **kw):
  ckpt = checkpoints.TrainCheckpointer(directory)
  for step in steps:
    ckpt.save(step, state=_state(step, **kw), run_state={'counts': jnp.full(4, step)},
              extra={'data_state': f'at {step}'})
  ckpt.close()


def test_the_latest_step_restores_exactly(tmp_path):
  _save(str(tmp_path), [1, 2])
  ckpt = checkpoints.TrainCheckpointer(str(tmp_path))
  state, run, extra = ckpt.restore_latest(_state(), {'counts': jnp.zeros(4, jnp.int32)})
  ckpt.close()
  np.testing.assert_array_equal(state['w'], _state(2.0)['w'])
  assert int(state['step']) == 7 and run['counts'].tolist() == [2] * 4
  assert extra == {'data_state': 'at 2'}


def test_an_unreadable_step_is_moved_aside_and_the_previous_one_used(tmp_path, capsys):
  _save(str(tmp_path), [1, 2])
  for path in glob.glob(str(tmp_path / '2' / 'state' / '**' / '*'), recursive=True):
    if os.path.isfile(path):
      with open(path, 'wb') as f:
        f.write(b'not a checkpoint')
  ckpt = checkpoints.TrainCheckpointer(str(tmp_path))
  state, _, extra = ckpt.restore_latest(_state(), {'counts': jnp.zeros(4, jnp.int32)})
  ckpt.close()
  assert extra == {'data_state': 'at 1'}
  np.testing.assert_array_equal(state['w'], _state(1.0)['w'])
  moved = glob.glob(str(tmp_path / 'unreadable' / '2-*'))
  assert len(moved) == 1 and os.listdir(moved[0])  # kept, not deleted
  assert 'checkpoint step 2 is unreadable' in capsys.readouterr().err


def test_a_step_of_other_shapes_is_refused_and_left_as_it_was(tmp_path):
  _save(str(tmp_path), [1], width=4)
  before = sorted(glob.glob(str(tmp_path / '**' / '*'), recursive=True))
  ckpt = checkpoints.TrainCheckpointer(str(tmp_path))
  with pytest.raises(checkpoints.CheckpointMismatch, match=r'w has shape \(2, 4\) stored, '
                     r'\(2, 3\) expected'):
    ckpt.restore_latest(_state(width=3), {'counts': jnp.zeros(4, jnp.int32)})
  ckpt.close()
  assert sorted(glob.glob(str(tmp_path / '**' / '*'), recursive=True)) == before


def test_no_step_restores_nothing(tmp_path):
  ckpt = checkpoints.TrainCheckpointer(str(tmp_path / 'empty'))
  assert ckpt.restore_latest(_state(), {}) is None
  ckpt.close()


def test_casts_touch_floats_only_and_the_frozen_copy_is_a_new_buffer():
  tree = {'w': jnp.ones(3, jnp.float32), 'i': jnp.arange(3)}
  cast = checkpoints.cast_floats(tree, jnp.bfloat16)
  assert cast['w'].dtype == jnp.bfloat16 and cast['i'].dtype == tree['i'].dtype
  frozen = checkpoints.frozen_copy(tree, jnp.float32, None)
  assert frozen['w'] is not tree['w']
  np.testing.assert_array_equal(frozen['w'], tree['w'])


@pytest.mark.parametrize('policy, match', [
    (dict(init='', checkpoint=''), 'is required'),
    (dict(checkpoint='/nonexistent'), 'not a Hugging Face model directory'),
    (dict(init='/nonexistent'), 'neither a shipped policy'),
    (dict(param_dtype='float16'), "config.policy.param_dtype='float16' is not valid"),
])
def test_a_bad_policy_section_is_named(policy, match):
  section = ml_collections.ConfigDict(
      dict(dict(init='base', checkpoint='', param_dtype='', compute_dtype='', ref_param_dtype=''),
           **policy))
  with pytest.raises(ValueError, match=match):
    checkpoints.check_policy_config(section)
