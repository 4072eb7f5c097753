"""Tests of jtc.rl.batch: a step's rollouts become the update's Batch as the config says: group
advantages of the (shaped) rewards, the token mask, the behaviour log-probs (recomputed or the
sampler's), the mismatch and its correction's weights, the token counts. The behaviour pass is
a stand-in with known log-probs, so every field has a closed form."""
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from jtc.rl import batch as batch_lib
from jtc.rl import rollout
from jtc.rl import update

G, T, V = 4, 3, 16
REWARDS_B = np.array([1, 0, 0, 1, 1, 1, 1, 0], np.float32)  # two groups of G = 4


def _rollout():
  B = len(REWARDS_B)
  completion_BT = np.arange(B * T).reshape(B, T) % V
  mask_BT = np.ones((B, T), np.int32)
  mask_BT[1, 2:] = 0  # row 1 stopped after 2 tokens
  return rollout.Rollout(tokens_BL=np.concatenate([np.ones((B, 2), np.int32), completion_BT], 1),
                         input_mask_BL=np.concatenate([np.ones((B, 2), np.int32), mask_BT],
                                                      1), completion_BT=completion_BT,
                         completion_mask_BT=mask_BT, sampler_logps_BT=np.full(
                             (B, T), -1.0, np.float32), truncated_B=np.arange(B) == 3,
                         rewards_B=REWARDS_B, texts=tuple('x' for _ in range(B)))


def _behaviour(params, tokens_BL, input_mask_BL):
  """Stand-in for the behaviour pass: log pi = -1 + 0.1 (token id mod 3) - 0.05 params."""
  del input_mask_BL
  return {'logps': -1.0 + 0.1 * (tokens_BL[:, 2:] % 3).astype(jnp.float32) - 0.05 * params}


def _config(**overrides):
  c = common.get_config('smoke')
  c.rollout.sampling.num_samples = G
  c.rollout.sampling.max_new_tokens = T
  c.update_from_flattened_dict(overrides)
  return c


def _make(c, params=0.0):
  return batch_lib.make_batch(c, [_rollout()], jnp.float32(params), update.RunState.init(V),
                              task=None, behaviour_fn=_behaviour, ref_params=None,
                              to_device=jnp.asarray)


def test_advantages_mask_and_behaviour_log_probs():
  batch, (metrics,), run_state = _make(_config())
  r_MG = REWARDS_B.reshape(-1, G)
  adv_MG = (r_MG - r_MG.mean(1, keepdims=True)) / (r_MG.std(1, keepdims=True) + 1e-6)  # Eq. 43
  np.testing.assert_allclose(batch.advantages_B, adv_MG.reshape(-1), rtol=1e-5)
  np.testing.assert_array_equal(batch.mask_BT, _rollout().completion_mask_BT)
  np.testing.assert_allclose(batch.old_logps_BT,
                             _behaviour(0.0,
                                        _rollout().tokens_BL, None)['logps'])
  assert metrics['reward_mean'] == pytest.approx(REWARDS_B.mean())
  assert metrics['frac_truncated'] == pytest.approx(1 / 8)
  assert batch.is_weights_BT is None and batch.ref_logps_BT is None and batch.token_weights_BT is None
  # Each real completion token counted once.
  want_V = np.bincount(_rollout().completion_BT[_rollout().completion_mask_BT > 0], minlength=V)
  np.testing.assert_array_equal(run_state.token_counts_V, want_V)


def test_the_mismatch_and_a_correction_come_from_behaviour_against_sampler():
  batch, (metrics,), _ = _make(_config(**{'rollout.correction': 'tis'}), params=-4.0)
  real = _rollout().completion_mask_BT > 0
  delta_BT = np.asarray(_behaviour(-4.0, _rollout().tokens_BL, None)['logps']) + 1.0
  assert metrics['mismatch/mean_abs'] == pytest.approx(np.abs(delta_BT[real]).mean(), rel=1e-5)
  # TIS: w = min(rho, C) with rho = pi_train / pi_sampler = exp(delta) > 1 here, C = 2.
  np.testing.assert_allclose(
      np.asarray(batch.is_weights_BT)[real],
      np.minimum(np.exp(delta_BT), 2.0)[real], rtol=1e-5)


def test_sampler_log_probs_and_the_dapo_options():
  c = _config(**{
      'rollout.behaviour_logps': 'sampler',
      'dapo.mask_truncated': True,
      'dapo.overlong_buffer': 1
  })
  batch, (metrics,), _ = _make(c)
  np.testing.assert_allclose(batch.old_logps_BT, -1.0)
  assert not np.asarray(batch.mask_BT)[3].any()  # the truncated row carries no gradient
  # Overlong shaping: completions of T = 3 tokens sit at the buffer's end: reward - 1.
  shaped = REWARDS_B - (_rollout().completion_mask_BT.sum(1) == T)
  assert metrics['reward_mean'] == pytest.approx(shaped.mean())
