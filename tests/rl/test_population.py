"""Seed populations (jtc.rl.population): member i of one program is the single run of its seed and
values; a population checkpoint resumes every member; bad input is named before any compute."""
import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from tests import procs
from configs import gspo
from jtc.analysis import metric_writer
from jtc.analysis import tracking
from jtc.rl import config_check
from jtc.rl import population as population_lib
from jtc.plan import suggest
from jtc.rl import trainer as trainer_lib
from jtc.rl import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NONDETERMINISTIC = ('time_', 'tokens_per_s')
VARY = 'optim.learning_rate=1e-4,3e-4;rollout.sampling.temperature=0.8'


def _config(**overrides):
  c = gspo.get_config('smoke')
  c.num_steps, c.log.diagnostics_every, c.seed = 1, 1, 3
  suggest.set_in(c, overrides)
  return c


def _step_1(config, workdir):
  trainer = trainer_lib.Trainer(config, workdir)
  try:
    return trainer.step(1), trainer.rollouts
  finally:
    trainer.close()


def test_each_member_is_the_single_run_of_its_seed_and_values(tmp_path):
  """Population of 2 seeds x 2 learning rates at a varied (traced) temperature, step 1 (two
  updates, so the learning rate acts): every member's rollouts and rewards equal the single run
  of its seed and values; grad_norm within 1e-5 relative, the loss within 1e-5 of its O(1)
  terms (vmapped matmuls round differently)."""
  pop_config = _config(**{'population.size': 2, 'population.vary': VARY})
  members = population_lib.members(pop_config)
  assert [(m.seed, dict(m.values)['optim.learning_rate']) for m in members
         ] == [(3, 1e-4), (4, 1e-4), (3, 3e-4), (4, 3e-4)]
  metrics, rollouts = _step_1(pop_config, str(tmp_path / 'pop'))
  for m in (members[1], members[2]):
    single = population_lib.member_config(pop_config, m)
    assert single.seed == m.seed and single.population.size == 1
    (want,), (want_rollout,) = _step_1(single, str(tmp_path / m.name))
    got, got_rollout = metrics[m.index], rollouts[m.index]
    np.testing.assert_array_equal(got_rollout.tokens_BL, want_rollout.tokens_BL)
    np.testing.assert_array_equal(got_rollout.rewards_B, want_rollout.rewards_B)
    for key in ('grad_norm', 'update_norm', 'param_norm', 'ratio_max'):
      np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    # The loss is a sum of O(1) terms A_i s_i (|A| ~ 1, s ~ 1) that nearly cancel (here ~5e-4):
    # 1e-5 relative to its terms, not to the cancelled total.
    for key in ('loss', 'pg_loss'):
      np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
    assert got['learning_rate'] == pytest.approx(want['learning_rate'], rel=1e-6)
  # The members differ (else the comparison would prove nothing): other seeds, other rollouts.
  assert not np.array_equal(rollouts[0].tokens_BL, rollouts[1].tokens_BL)
  assert metrics[0]['update_norm'] != pytest.approx(metrics[2]['update_norm'], rel=1e-3)


def _cmd(workdir, *extra):
  return [
      sys.executable, '-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={workdir}',
      '--config.num_steps=3', '--config.population.size=2',
      '--config.population.vary=optim.learning_rate=1e-4,3e-4', '--config.eval.every=3', *extra
  ]


def _members(workdir):
  return {
      os.path.basename(d): [{
          k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)
      } for r in metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))
                           ] for d in metric_writer.run_dirs(workdir)
  }


@pytest.mark.slow  # 2.5 min; the trainer's SIGKILL resume is tests/rl/test_train.py's, in CI
def test_a_population_killed_and_resumed_equals_an_uninterrupted_one(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  proc = procs.run(_cmd(whole), f'{whole}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0, proc
  assert len(proc.stdout.strip().splitlines()) == 4  # one summary line per member
  ended = procs.kill_after_checkpoint(_cmd(killed), killed, 1, cwd=REPO, env=env)
  assert ended.returncode == -9, ended
  proc = procs.run(_cmd(killed), f'{killed}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0 and 'resumed from step' in proc.stderr, proc
  a, b = _members(whole), _members(killed)
  assert sorted(a) == sorted(b) and len(a) == 4
  for name in a:
    assert [r['step'] for r in a[name]] == [r['step'] for r in b[name]] == [0, 1, 2, 3]
    for ra, rb in zip(a[name], b[name]):
      assert ra.keys() == rb.keys()
      for k in ra:
        np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=f'{name} {k}')
  # Each member directory is a run's: its single-run config and the member marker.
  for d in metric_writer.run_dirs(whole):
    with open(os.path.join(d, 'config.json')) as f:
      member = json.load(f)['config']
    assert member['population']['size'] == 1 and member['population']['vary'] == ''
    assert os.path.isfile(os.path.join(d, workdir_lib.MEMBER_FILE))
  # A member directory is not a workdir of its own, and the population keeps its members.
  for bad, why in ((metric_writer.run_dirs(whole)[0], 'member of the population'),):
    proc = subprocess.run(_cmd(bad), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow  # 3 min: two population runs (a run, then its resume)
def test_each_member_is_a_wandb_run_of_its_own_stream_in_the_populations_group(tmp_path):
  """2 members, run for 1 step, then resumed to 2 (num_steps raised): each member's W&B run,
  read back, holds exactly its metrics.jsonl (one W&B run id continued over the resume), the
  two runs are grouped under the population's name and their streams differ."""
  env = dict(procs.offline_wandb_env(str(tmp_path / 'wandb_env')), JAX_PLATFORMS='cpu')
  workdir = str(tmp_path / 'pop')
  cmd = [
      sys.executable, '-m', 'jtc.train', '--config=configs/gspo.py:smoke', f'--workdir={workdir}',
      '--config.population.size=2', '--config.log.wandb_project=jtc-tests',
      '--config.log.wandb_run_name=pop-test'
  ]
  for steps in (1, 2):
    proc = procs.run(cmd + [f'--config.num_steps={steps}'], f'{workdir}.{steps}.stderr.log',
                     cwd=REPO, env=env)
    assert proc.returncode == 0, proc
  runs, streams = [], []
  for d in metric_writer.run_dirs(workdir):
    records = tracking.offline_records(d)
    jsonl = metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))
    logged = tracking.history(records)
    assert [r['step'] for r in logged] == [r['step'] for r in jsonl] == [0, 1, 2]
    assert logged == [{'step': r['step'], **tracking.for_wandb(r)} for r in jsonl]
    starts = [r['run'] for r in records if r['type'] == 'run']
    assert len(starts) == 2 and starts[0]['run_id'] == starts[1]['run_id']  # resumed
    runs.append(starts[0])
    streams.append(jsonl)
  assert [r['display_name'] for r in runs] == ['pop-test/seed0', 'pop-test/seed1']
  assert [r['run_group'] for r in runs] == ['pop-test', 'pop-test']
  assert [r['config']['update']['seed'] for r in runs] == [0, 1]
  assert runs[0]['run_id'] != runs[1]['run_id']
  assert streams[0][1]['loss'] != streams[1][1]['loss']  # each member's own stream


@pytest.mark.parametrize('overrides, match', [
    ({
        'population.size': 0
    }, r'config.population.size=0 must be an int >= 1'),
    ({
        'population.vary': 'loss.name=1,2'
    }, r"'loss.name' cannot vary inside one program.*valid: \['optim.learning_rate'"),
    ({
        'population.vary': 'rollout.sampling.num_samples=4,8'
    }, r"'rollout.sampling.num_samples' cannot vary"),
    ({
        'population.vary': 'optim.learning_rate=fast,slow'
    }, r"optim.learning_rate='fast,slow' must be a comma-separated list of numbers"),
    ({
        'population.vary': 'loss.hparams.eps_high=0.1,-0.2'
    }, r'member seed3__loss.hparams.eps_high=-0.2: eps_high=-0.2 must be > 0'),
    ({
        'population.size': 3,
        'mesh.population': 2
    }, r'config.mesh.population=2 does not divide the 3 members'),
    ({
        'population.size': 2,
        'token_budget': 1000
    }, r'config.token_budget=1000 needs a single run'),
])
def test_bad_population_input_is_named_before_compute(overrides, match):
  with pytest.raises(ValueError, match=match):
    config_check.validate(_config(**overrides))


def test_a_workdir_never_changes_population(tmp_path):
  """Resuming with another size or other varied values, or a single run's workdir as a
  population, is refused even with --allow_config_change (the checkpoint would be restored into
  other members)."""
  run, pop = _config(), _config(**{'population.size': 2})
  workdir_lib.record_config(str(tmp_path), pop, 1)
  for other in (_config(**{'population.size': 3}),
                _config(**{
                    'population.size': 2,
                    'population.vary': 'optim.learning_rate=1e-4,3e-4'
                }), run):
    with pytest.raises(workdir_lib.WorkdirError, match='other population members'):
      workdir_lib.check_identity(str(tmp_path), other, has_checkpoint=True, allow_changes=True)
  single = tmp_path / 'single'
  single.mkdir()
  workdir_lib.record_config(str(single), run, 1)
  with pytest.raises(workdir_lib.WorkdirError, match=r'population.size: 1 -> 2'):
    workdir_lib.check_identity(str(single), pop, has_checkpoint=True, allow_changes=True)


def test_member_names_configs_and_values():
  c = _config(**{'population.size': 2, 'population.vary': 'loss.hparams.eps_high=4e-4,5e-4'})
  pop = population_lib.Population.of(c)
  assert pop.n == 4 and pop.batched
  assert [m.name for m in pop.members] == [
      'seed3__loss.hparams.eps_high=0.0004', 'seed4__loss.hparams.eps_high=0.0004',
      'seed3__loss.hparams.eps_high=0.0005', 'seed4__loss.hparams.eps_high=0.0005'
  ]
  np.testing.assert_array_equal(pop.values('loss.hparams.eps_high'),
                                np.float32([4e-4, 4e-4, 5e-4, 5e-4]))
  assert pop.values('optim.learning_rate') is None
  m = population_lib.member_config(c, pop.members[3])
  assert (m.seed, m.loss.hparams.eps_high, m.population.vary) == (4, 5e-4, '')
  assert isinstance(m, ml_collections.ConfigDict)
  single = population_lib.Population.of(_config())
  assert not single.batched and single.stack([np.ones(2)]).shape == (2,)
