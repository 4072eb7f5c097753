"""Tests of jtc.analysis.ledger: known-positive and negative controls of cancellation on a planted
group, the clip flag, and a real run's ledger loading in one call."""
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import ledger as ledger_lib

G, P, T, SHARED = 4, 3, 6, 3
ADV = np.array([1.2, -0.4, 0.7, -1.5], np.float32)  # sums to 0, as group advantages do


def _planted(shared_ratio=1.0):
  """One group of G equal-length completions sharing their first SHARED tokens (prompt too),
  off-policy: the shared tokens have ratio ``shared_ratio`` (the same for every member: same
  context, same token), the others member-specific ratios."""
  prompt = np.tile([[1, 2, 3]], (G, 1))
  completion = np.concatenate(
      [np.tile([[5, 6, 7]],
               (G, 1)), np.arange(G * 3).reshape(G, 3) + 10], axis=1)
  tokens = np.concatenate([prompt, completion], axis=1).astype(np.int32)
  rng = np.random.default_rng(0)
  old = rng.uniform(-2.0, -0.5, (G, T)).astype(np.float32)
  old[:, :SHARED] = old[0, :SHARED]  # shared tokens: the same behaviour log-prob
  log_ratio = rng.normal(0.0, 0.1, (G, T)).astype(np.float32)
  log_ratio[:, :SHARED] = np.log(shared_ratio)
  return dict(tokens_BL=jnp.asarray(tokens), input_mask_BL=jnp.ones((G, P + T), jnp.int32),
              old_logps_BT=jnp.asarray(old), advantages_B=jnp.asarray(ADV), mask_BT=jnp.ones(
                  (G, T), jnp.float32), group_size=G,
              completion_start=P), jnp.asarray(old + log_ratio)


# Per-token weight 1/(B T) (seq_mean_token_sum_norm) for every loss, so that the coefficients of
# a shared position differ only by each objective's own trajectory weights.
AGG = {'aggregation': 'seq_mean_token_sum_norm'}


@pytest.mark.parametrize(
    'loss, hparams, shared_ratio, cancels',
    [
        ('grpo', {}, 1.05, True),  # token-level, inside the clip: exchangeable
        ('dfpo_min_replace', {}, 1.05, True),  # one weight per group: exchangeable
        ('grpo_fix', {}, 1.1, True),  # symmetric clip (inside it here): exchangeable
        ('gspo', {}, 1.05, False),  # sequence-coupled weights s_i differ (Cor. 3.3)
        ('grpo', {
            'eps_low': 0.2,
            'eps_high': 0.2
        }, 1.3, False),  # PPO's clip: only A > 0 is clipped
    ])
def test_shared_tokens_cancel_exactly_for_exchangeable_objectives(loss, hparams, shared_ratio,
                                                                  cancels):
  inputs, logps = _planted(shared_ratio)
  cols = ledger_lib.token_ledger(logps, loss_name=loss, loss_hparams={**AGG, **hparams}, **inputs)
  shared = np.asarray(cols['shared'])
  assert shared[:, :SHARED].all() and not shared[:, SHARED:].any()
  coef = np.asarray(cols['coef'])
  net = np.abs(coef[:, :SHARED].sum(0)).sum()
  gross = np.abs(coef[:, :SHARED]).sum()
  assert gross > 1e-4  # the group does put weight on its shared tokens
  if cancels:
    assert net < 1e-6 * gross, (net, gross)
  else:
    assert net > 0.05 * gross, (net, gross)


def test_a_clipped_token_shows_coefficient_zero_and_its_flag():
  inputs, logps = _planted(1.3)  # shared tokens at ratio 1.3 > 1 + 0.2
  cols = ledger_lib.token_ledger(logps, loss_name='grpo', loss_hparams=AGG, **inputs)
  coef, high = np.asarray(cols['coef']), np.asarray(cols['clip_high'])
  positive = ADV > 0
  assert high[positive, :SHARED].all() and (coef[positive, :SHARED] == 0).all()
  assert not high[~positive, :SHARED].any() and (coef[~positive, :SHARED] != 0).all()
  assert not np.asarray(cols['gated']).any()
  # GRPO-fix's symmetric clip acts on every member alike: all clipped, all 0 (Eq. 79-80).
  cols = ledger_lib.token_ledger(logps, loss_name='grpo_fix', loss_hparams=AGG, **inputs)
  assert np.asarray(cols['clip_high'])[:, :SHARED].all()
  assert (np.asarray(cols['coef'])[:, :SHARED] == 0).all()


def test_a_run_writes_a_ledger_that_loads_in_one_call(run_with_ledger):
  assert ledger_lib.steps(run_with_ledger) == [1, 2]
  ledger = ledger_lib.load(run_with_ledger, 2)
  assert ledger.points == ledger_lib.POINTS
  c = ledger.columns
  B, T = c['completion_BT'].shape
  assert c['coef_behaviour_BT'].shape == (B, T) and c['gated_offpolicy_B'].shape == (B,)
  # At the behaviour policy every ratio is 1; before the second update the policy has moved.
  real = c['completion_mask_BT'] > 0
  np.testing.assert_allclose(c['ratio_behaviour_BT'][real], 1.0, atol=1e-5)
  assert np.abs(c['ratio_offpolicy_BT'][real] - 1).max() > 1e-6
  np.testing.assert_allclose(c['mismatch_BT'][real],
                             (c['logps_behaviour_BT'] - c['sampler_logps_BT'])[real], atol=1e-6)
  rows = ledger.rows('offpolicy')
  assert len(rows) == int(real.sum()) and {'coef', 'shared', 'clip_high', 'token'} <= set(rows[0])
  assert [r['token'] for r in rows if r['row'] == 0
         ] == [ledger.token_text(i) for i in c['completion_BT'][0, real[0]]]
