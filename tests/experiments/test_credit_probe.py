"""Tests of experiments/credit_probe.py (with `credit_step.probe` replaced by a fake): a probe
sweep writes one summary per objective and seed in the training sweeps' layout, with the
declared metrics, skips a seed already summarised, reports a failure per run, and its settings
come from the sweep's shared ('probe.<field>', value)s."""

import numpy as np

from experiments import common
from experiments import credit_probe
from experiments import sweeps as sweeps_lib
from jtc.analysis import credit_step


def _measured(residual):
  parts = {
      'own': np.array([[0.1, -0.2]]),
      'same': np.array([[-0.1, 0.1]]),
      'other': np.array([[0.05, 0.0]]),
      'conf_bin': np.array([[0, 2]])
  }
  summary = {
      'contested_residual': residual,
      'same_share_of_coupling': 0.6,
      'same_low_conf_share': 0.7,
      'low_conf_token_share': 0.5,
      'first_order_rel_error': 0.05
  }
  loss = {
      'frac_traj_gated': 0.1,
      'coef_mass_vs_gspo': 1.0,
      'clip_frac_high': 0.0,
      'clip_frac_low': 0.0
  }
  return {
      'summary': summary,
      'coupling': parts,
      'flip': {
          'boosted_gap': 0.1,
          'tokens_pos': 3
      },
      'mass': {
          'sign_balance': 0.5
      },
      'loss_metrics': loss
  }


def test_a_probe_sweep_writes_a_summary_per_objective_and_seed(tmp_path, monkeypatch):
  calls = []

  def fake_probe(model_config, params, gen, task, setting, seed, objectives_):
    del model_config, params, gen, task
    calls.append((seed, objectives_, setting.prompts))
    return {name: _measured(0.1 * i) for i, name in enumerate(objectives_)}

  monkeypatch.setattr(credit_step, 'probe', fake_probe)
  sweep = sweeps_lib.get_sweep('credit_probe', smoke=True)
  assert credit_probe.setting_of(sweep).prompts == dict(sweep.shared)['probe.prompts']
  res = credit_probe.run_probe(sweep, seeds=2, first_seed=0, results_dir=str(tmp_path))
  assert [c[:2] for c in calls] == [(0, ('gspo', 'dfpo_min_replace')),
                                    (1, ('gspo', 'dfpo_min_replace'))]
  assert sorted(s for s, _ in res.values()) == ['ok'] * 4
  summaries = common.load_summaries(str(tmp_path))
  assert len(summaries) == 4 and {s['num_steps'] for s in summaries} == {1}
  dfpo = next(s for s in summaries if s['run'] == 'dfpo_min_replace' and s['seed'] == 1)
  assert common.metric_value(dfpo, 'final:credit/contested_residual') == 0.1
  assert np.isclose(common.metric_value(dfpo, 'final:credit/same_share_excess'), 0.1)
  assert np.isclose(common.metric_value(dfpo, 'final:credit/same_low_conf_excess'), 0.2)
  assert common.metric_value(dfpo, 'final:flip/boosted_gap') == 0.1
  # Summarised seeds are skipped; a failing probe is reported per run, nothing written.
  again = credit_probe.run_probe(sweep, seeds=2, first_seed=0, results_dir=str(tmp_path))
  assert {s for s, _ in again.values()} == {'skipped'} and len(calls) == 2
  monkeypatch.setattr(credit_step, 'probe', lambda *a, **k: 1 / 0)
  failed = credit_probe.run_probe(sweep, seeds=1, first_seed=2, results_dir=str(tmp_path))
  assert {s for s, _ in failed.values()} == {'failed'}
  assert 'ZeroDivisionError' in next(iter(failed.values()))[1]
