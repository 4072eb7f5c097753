"""Tests of jtc.objectives.loss: `compute_loss` against numpy loops for every loss and
aggregation, its metrics (the effective step, Asym), degenerate and bad inputs, the defaults."""
import jax.numpy as jnp
import numpy as np
import pytest

from jtc import objectives
from tests.objectives.loss_reference import G, B, T, AGGS, SEQ_LOSSES, run, run_all_aggregations, np_reference, reference_inputs, off_policy_inputs

_REF_SEED = 5


def _reference_hparams(name):
  hp = {
      'kl_coef': 0.05,
      'entropy_coef': 0.01,
      'kl_estimator': ['k1', 'k2', 'k3'][sorted(objectives.LOSSES).index(name) % 3]
  }
  if name in SEQ_LOSSES:
    hp.update(eps_low=0.05, eps_high=0.08)
  if name in ('grpo', 'delta'):
    hp['dual_clip_c'] = 1.3
  return hp


@pytest.mark.parametrize('name', sorted(objectives.LOSSES))
def test_every_loss_and_aggregation_matches_numpy_loops(name):
  logps, old, adv, mask, tw, ref, ent = reference_inputs(_REF_SEED)
  hp = _reference_hparams(name)
  results = run_all_aggregations(name, logps, old, adv, mask, ref=ref, ent=ent,
                                 tw=tw if name == 'delta' else None, **hp)
  for agg, (loss, metrics, grad) in zip(AGGS, results):
    ref_loss, ref_grad, ref_metrics = np_reference(name, logps, old, adv, mask, {
        **hp, 'aggregation': agg
    }, tw=tw, ref=ref, ent=ent)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6, err_msg=agg)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6, err_msg=agg)
    for k, v in ref_metrics.items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-4, atol=1e-6, err_msg=f'{agg} {k}')
    assert 'kl' in metrics and 'entropy' in metrics


def test_reference_inputs_exercise_clipping():
  """Guards the reference test: its inputs clip on both sides and for sequences."""
  logps, old, adv, mask, _, _, _ = reference_inputs(_REF_SEED)
  for name in ('grpo', 'gspo'):
    _, _, m = np_reference(name, logps, old, adv, mask, {
        **_reference_hparams(name), 'aggregation': 'token_mean'
    })
    assert m['clip_frac_low'] > 0 and m['clip_frac_high'] > 0


def test_dfpo_variants_with_solver_and_global_scale_match_numpy():
  logps, old, adv, mask, _, _, _ = reference_inputs(1)
  for name, hp in [('dfpo_pos_orth_proj', {
      'solver': 'truncate_rebalance',
      'trunc_eps': 0.5
  }), ('dfpo_min_replace', {
      'global_scale': 0.5
  }), ('dfpo_orth_proj', {
      'eps': 0.1
  })]:
    hp = {**hp, 'aggregation': 'token_mean'}
    loss, _, grad = run(name, logps, old, adv, mask, **hp)
    ref_loss, ref_grad, _ = np_reference(name, logps, old, adv, mask, hp)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('name', sorted(objectives.LOSSES))
def test_effective_step_metrics_match_the_gradient(name):
  """coef_mass = sum |d pg_loss / d log pi| (jax.grad of the loss itself, no KL / entropy),
  coef_mass_vs_gspo = that over GSPO's on the same inputs, frac_traj_gated counts the live
  trajectories with an all-zero gradient."""
  logps, old, adv, mask, _ = off_policy_inputs(noise=0.3)
  tw = np.random.default_rng(0).uniform(0.8, 1.2, (B, T)) if name == 'delta' else None
  _, m, grad = run(name, logps, old, adv, mask, tw=tw)
  gspo_hp = ({
      k: objectives.default_hparams(name)[k] for k in ('eps_low', 'eps_high', 'eps')
  } if name in SEQ_LOSSES else {})
  agg = objectives.default_hparams(name)['aggregation']
  _, _, g_gspo = run('gspo', logps, old, adv, mask, aggregation=agg, **gspo_hp)
  np.testing.assert_allclose(m['coef_mass'], np.abs(grad).sum(), rtol=1e-5)
  np.testing.assert_allclose(m['coef_mass_vs_gspo'],
                             np.abs(grad).sum() / np.abs(g_gspo).sum(), rtol=1e-5)
  live = (adv != 0) & (mask.sum(1) > 0)
  gated = live & np.all(grad == 0, axis=1)
  assert m['frac_traj_gated'] == pytest.approx(gated.sum() / live.sum())


def test_asym_is_eq23_on_policy_it_is_var_a_for_every_method():
  """With Eq. 14's weights GSPO's Asym uses s_i clipped or not (the gated variant drops them);
  on-policy every weight is 1, so Asym = mean Var(A) for every method (it cannot tell methods
  apart there)."""
  logps, old, adv, mask, clipped = off_policy_inputs()
  _, m, _ = run('gspo', logps, old, adv, mask)
  s = np.exp(
      np.array([np.sum((logps[i] - old[i]) * mask[i]) / max(mask[i].sum(), 1) for i in range(B)]))
  np.testing.assert_allclose(m['asym'], np.mean((s * adv).reshape(-1, G).var(1)), rtol=1e-5)
  np.testing.assert_allclose(m['asym_gated'],
                             np.mean((np.where(clipped, 0, s) * adv).reshape(-1, G).var(1)),
                             rtol=1e-5)
  var_a = np.mean(adv.reshape(-1, G).var(1))
  mask[3, :2] = 1.0  # a fully masked row has token-mean weight 0, not 1
  for name in sorted(objectives.LOSSES):
    if name in ('sapo', 'delta'):
      continue  # their Eq. 14 weight is not 1 at r = 1 (gate derivative, lambda)
    _, m, _ = run(name, logps, logps, adv, mask)
    np.testing.assert_allclose(m['asym'], var_a, rtol=1e-5, err_msg=name)


def test_clip_gating_validation():
  with pytest.raises(ValueError, match=r"clip_gating='ppo'.*\['gspo', 'none'\]"):
    _call('dfpo_min_replace', clip_gating='ppo')
  with pytest.raises(ValueError, match='stop_gradient=True'):
    _call('dfpo_min_replace', clip_gating='gspo', stop_gradient=False)
  with pytest.raises(ValueError, match='clip_gating'):
    _call('gspo', clip_gating='gspo')  # GSPO gates by definition; not a GSPO hyper-parameter


_DEGENERATE_CONFIGS = [(n, None) for n in sorted(objectives.LOSSES)] + [(n, {
    'stop_gradient': False,
    'eps': 0.1
}) for n in ('dfpo_min_replace', 'dfpo_orth_proj', 'dfpo_pos_orth_proj')] + [
    ('dfpo_pos_orth_proj', {
        'stop_gradient': False,
        'eps': 0.1,
        'solver': 'truncate_rebalance'
    })
]


@pytest.mark.parametrize('name,hp', _DEGENERATE_CONFIGS)
def test_degenerate_inputs_are_finite(name, hp):
  logps, old, adv, mask, tw, ref, ent = reference_inputs(9)
  mask[4] = 0.0  # fully masked completion in group 1
  adv[:G] = 0.0  # zero-std group 0
  old[G:] = logps[G:]  # group 1: all weights equal (r = 1)
  old[5, :] = logps[5, :] + 200.0  # weight exp(-200) == 0 in float32
  logps[4, :] = -np.inf  # padding may hold -inf
  ref[4, :] = np.nan
  tw[2, :] = 0.0

  def results(mask):
    if hp is None:  # the reference-test configs, with KL and entropy terms
      return run_all_aggregations(name, logps, old, adv, mask, ref=ref, ent=ent,
                                  tw=tw if name == 'delta' else None, **_reference_hparams(name))
    return [run(name, logps, old, adv, mask, **hp)]

  for loss, metrics, grad in results(mask):
    assert np.isfinite(loss)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[4] == 0.0)
    for k, v in metrics.items():
      assert np.isfinite(v), k
    assert metrics['frac_degenerate_groups'] == 0.5
  for loss, metrics, grad in results(np.zeros_like(mask)):  # whole batch masked
    assert np.isfinite(loss) and np.all(grad == 0.0)
    assert all(np.isfinite(v) for v in metrics.values())


def _call(name='grpo', b=4, t=3, g=2, **kw):
  args = dict(logps=jnp.zeros((b, t)), old_logps=jnp.zeros((b, t)), advantages=jnp.zeros((b,)),
              mask=jnp.ones((b, t)), group_size=g)
  args.update(kw)
  return objectives.compute_loss(name, **args)


def test_bad_inputs_raise_value_errors():
  with pytest.raises(ValueError, match=r"'ppo'.*valid: \['cispo'"):
    _call('ppo')
  with pytest.raises(ValueError, match=r"aggregation='mean'.*valid: \['seq_mean_token_mean'"):
    _call(aggregation='mean')
  with pytest.raises(ValueError, match=r"\['eps'\].*valid:.*eps_high"):
    _call(eps=0.1)  # grpo has eps_low/eps_high, not the GSPO eps
  with pytest.raises(ValueError, match=r"kl_estimator='k4'.*\['k1', 'k2', 'k3'\]"):
    _call(kl_estimator='k4')
  with pytest.raises(ValueError, match=r"solver='cg'.*\['qp', 'truncate_rebalance'\]"):
    _call('dfpo_pos_orth_proj', solver='cg')
  with pytest.raises(ValueError, match='group_size=3 must be a positive int dividing'):
    _call(g=3)
  with pytest.raises(ValueError, match='old_logps'):
    _call(old_logps=jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match='mask'):
    _call(mask=jnp.ones((3, 3)))
  with pytest.raises(ValueError, match='advantages'):
    _call(advantages=jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match='logps'):
    _call(logps=jnp.zeros((4,)))
  with pytest.raises(ValueError, match='token_weights'):
    _call('delta')
  with pytest.raises(ValueError, match='token_weights'):
    _call('grpo', token_weights=jnp.ones((4, 3)))
  with pytest.raises(ValueError, match='ref_logps'):
    _call(kl_coef=0.1)
  with pytest.raises(ValueError, match='entropy'):
    _call(entropy_coef=0.1)
  with pytest.raises(ValueError, match='dual_clip_c'):
    _call(dual_clip_c=0.5)


def test_default_hparams_cover_the_signature_and_round_trip():
  for name in objectives.LOSSES:
    hp = objectives.default_hparams(name)
    assert {'aggregation', 'kl_coef', 'kl_estimator', 'entropy_coef'} <= set(hp)
    assert hp['aggregation'] in objectives.AGGREGATIONS
  assert objectives.default_hparams('dfpo_pos_orth_proj')['solver'] == 'qp'
  assert objectives.default_hparams('dapo')['eps_high'] == 0.28
  with pytest.raises(ValueError, match='valid'):
    objectives.default_hparams('nope')
