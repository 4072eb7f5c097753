"""config.rollout.policy_lag: rollouts from the parameters of k steps ago, as an asynchronous
trainer's. The lag starts at the initial policy, so step 1 of every lag is the synchronous step;
after that the proximal policy moves away from the behaviour one, the more so the longer the
lag; the lagged parameters are checkpointed, so a killed run resumes exactly."""
import os
import re
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from tests import procs
from configs import gspo
from jtc.analysis import metric_writer
from jtc.rl import batch as batch_lib
from jtc.rl import config_check
from jtc.rl import trainer as trainer_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NONDETERMINISTIC = ('time_', 'tokens_per_s')


def _config(lag, mode='behaviour', num_steps=3):
  """GSPO smoke from the shipped base policy (its groups have mixed rewards, so the parameters
  move) at a learning rate large enough for the lag to show in a few steps."""
  c = gspo.get_config('smoke')
  c.num_steps, c.seed, c.eval.every, c.log.diagnostics_every = num_steps, 5, 0, 0
  c.rollout.prompts_per_step, c.optim.minibatch_prompts = 4, 4  # one update per step
  c.optim.learning_rate, c.optim.warmup_frac = 3e-3, 0.0
  c.rollout.policy_lag, c.rollout.policy_lag_mode = lag, mode
  return c


def _steps(config, workdir):
  trainer = trainer_lib.Trainer(config, workdir)
  try:
    return [trainer.step(s)[0] for s in range(1, config.num_steps + 1)]
  finally:
    trainer.close()


def _shared(a, b):
  return sorted(k for k in set(a) & set(b) if not k.startswith(NONDETERMINISTIC))


def _runs(keys, tmp_path_factory):
  return {
      (lag, mode): _steps(_config(lag, mode), str(tmp_path_factory.mktemp(f'lag{lag}{mode}')))
      for lag, mode in keys
  }


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The synchronous trainer and a lag of 2, 3 steps each (CI's set)."""
  return _runs(((0, 'behaviour'), (2, 'behaviour')), tmp_path_factory)


@pytest.fixture(scope='module')
def more_runs(tmp_path_factory):
  """A lag of 1, and of 2 in the decoupled mode (the slow set)."""
  return _runs(((1, 'behaviour'), (2, 'decoupled')), tmp_path_factory)


@pytest.mark.slow  # two lagged trainers
def test_step_1_of_a_lag_is_the_synchronous_step_and_the_lag_then_shows(runs):
  """The lag starts at the initial policy, so step 1 is the synchronous step exactly; from step
  2 on the proximal policy is not the behaviour one (the known positive), while the synchronous
  trainer measures no lag at all (the negative)."""
  sync, lagged = runs[0, 'behaviour'], runs[2, 'behaviour']
  assert not any(k.startswith('lag/') for r in sync for k in r)
  assert lagged[0]['lag/abs_log_ratio'] == 0.0
  for k in _shared(sync[0], lagged[0]):
    assert lagged[0][k] == sync[0][k], k
  assert lagged[1]['lag/abs_log_ratio'] > 0 and lagged[2]['lag/log_ratio_std'] > 0
  # From step 2 the rollouts come from another policy than the synchronous run's.
  assert any(lagged[1][k] != sync[1][k] for k in ('reward_mean', 'response_length', 'entropy'))


@pytest.mark.slow
def test_the_ratio_spread_grows_with_the_lag(runs, more_runs):
  """At step 3, past both lags' warm-up, log pi_prox - log pi_behav spreads more for k = 2
  (theta_3 against theta_1) than for k = 1 (against theta_2)."""
  one, two = more_runs[1, 'behaviour'][-1], runs[2, 'behaviour'][-1]
  assert 0.0 < one['lag/log_ratio_std'] < two['lag/log_ratio_std']
  assert one['lag/abs_log_ratio'] < two['lag/abs_log_ratio']


@pytest.mark.slow
def test_decoupled_mode_centres_the_clip_on_the_proximal_policy(runs, more_runs):
  """With one update per step the update starts at the proximal policy: in the decoupled mode
  every ratio is 1 (up to the rounding of two compiled programs), while the behaviour mode's
  ratios, taken against the policy of 2 steps before, are not (the positive control)."""
  behaviour, decoupled = runs[2, 'behaviour'][-1], more_runs[2, 'decoupled'][-1]
  assert decoupled['lag/abs_log_ratio'] > 0
  assert abs(decoupled['ratio_max'] - 1) < 1e-4 and abs(decoupled['ratio_min'] - 1) < 1e-4
  assert behaviour['ratio_max'] - behaviour['ratio_min'] > 1e-3


def test_decoupled_weights_are_the_probability_ratio_on_real_tokens():
  prox_BT = jnp.log(jnp.array([[0.5, 0.2, 0.9], [0.1, 0.3, 0.3]]))
  behav_BT = jnp.log(jnp.array([[0.25, 0.2, 0.3], [0.2, 0.3, 0.6]]))
  mask_BT = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
  w_BT = batch_lib.decoupled_weights(prox_BT, behav_BT, mask_BT)
  np.testing.assert_allclose(w_BT, [[2.0, 1.0, 0.0], [0.5, 1.0, 0.5]], rtol=1e-6)
  m = batch_lib.lag_metrics(prox_BT, behav_BT, mask_BT)
  d = np.log([2.0, 1.0, 0.5, 1.0, 0.5])
  np.testing.assert_allclose(m['abs_log_ratio'], np.abs(d).mean(), rtol=1e-6)
  np.testing.assert_allclose(m['log_ratio_std'], d.std(), rtol=1e-5)
  np.testing.assert_allclose(m['abs_log_ratio_max'], np.log(2.0), rtol=1e-6)


@pytest.mark.parametrize('key,value,needle', [('rollout.policy_lag', -1, 'policy_lag'),
                                              ('rollout.policy_lag_mode', 'async', 'async')])
def test_bad_lag_settings_are_named(key, value, needle):
  c = _config(1)
  section, leaf = key.split('.')
  c[section][leaf] = value
  with pytest.raises(ValueError, match=needle):
    config_check.validate(c)


def test_decoupled_without_a_lag_is_refused():
  with pytest.raises(ValueError, match='policy_lag >= 1'):
    config_check.validate(_config(0, 'decoupled'))


def _cmd(workdir):
  return [
      sys.executable, '-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={workdir}',
      '--config.num_steps=4', '--config.rollout.policy_lag=2', '--config.optim.learning_rate=3e-3',
      '--config.eval.every=0', '--config.log.diagnostics_every=0'
  ]


@pytest.mark.slow
def test_sigkill_then_resume_keeps_the_lagged_parameters(tmp_path):
  """Killed after step 2's checkpoint, the run resumes with the lagged parameters of steps 1
  and 2 it saved (re-initialising them at the current policy would change steps 3 and 4)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  ref = str(tmp_path / 'ref')
  proc = procs.run(_cmd(ref), f'{ref}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0, proc
  killed = str(tmp_path / 'killed')
  ended = procs.kill_after_checkpoint(_cmd(killed), killed, 2, cwd=REPO, env=env)
  assert ended.returncode == -9, ended
  proc = procs.run(_cmd(killed), f'{killed}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0, proc
  assert 2 <= int(re.search(r'resumed from step (\d+)', proc.stderr)[1]) < 4
  a, b = (metric_writer.read_jsonl(os.path.join(w, 'metrics.jsonl')) for w in (killed, ref))
  assert [r['step'] for r in a] == [r['step'] for r in b] == [1, 2, 3, 4]
  for ra, rb in zip(a, b):
    for k in _shared(ra, rb):
      np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert b[-1]['lag/abs_log_ratio'] > 0
