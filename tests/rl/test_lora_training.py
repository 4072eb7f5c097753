"""LoRA runs of the trainer (config `lora`, jtc.models.lora): the default config trains at rank 4
with only the adapters trained and checkpointed while the base stays bit for bit; step 1 samples
exactly what full fine-tuning samples (B = 0); a LoRA population's member i is the single LoRA
run of seed + i; a workdir never resumes at another rank."""
import os
import sys

import jax
import ml_collections
import numpy as np
import pytest

from configs import dfpo_min_replace
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import metric_writer
from jtc.models import lora
from jtc.rl import checkpoints
from jtc.rl import config_check
from jtc.rl import population as population_lib
from jtc.plan import suggest
from jtc.rl import trainer as trainer_lib
from jtc.rl import workdir as workdir_lib
from tests import procs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**overrides):
  """The default method's smoke config, one step, groups with mixed rewards."""
  c = dfpo_min_replace.get_config('smoke')
  c.num_steps, c.seed, c.lora.rank = 1, 5, 4
  c.rollout.prompts_per_step, c.rollout.sampling.num_samples = 2, 8
  c.eval.every = 0
  suggest.set_in(c, overrides)
  return c


def _step_1(config, workdir, *, save=False):
  trainer = trainer_lib.Trainer(config, workdir)
  try:
    metrics = trainer.step(1)
    if save:
      trainer._save(1)  # pylint: disable=protected-access
    return trainer, metrics, trainer.rollouts
  finally:
    trainer.close()


@pytest.mark.slow  # a trainer of 2 steps; the adapters' gradients are in CI (models/test_lora.py)
def test_rank_4_trains_the_adapters_alone_on_a_frozen_base(tmp_path):
  c = _config(**{'log.ledger_every': 1})
  trainer, (metrics,), _ = _step_1(c, str(tmp_path / 'run'), save=True)
  _, base, _ = checkpoints.load_policy(c.policy)
  # What is trained is the adapters, at the configured rank, for every target.
  assert lora.is_adapters(trainer.state.params)
  assert sorted(trainer.state.params['layers']['attn']) == ['k', 'o', 'q', 'v']
  assert lora.rank_of(trainer.state.params) == 4
  # They moved (a known positive: some group had mixed rewards, so the gradient is not zero).
  assert metrics['adv/frac_zero_std'] < 1 and metrics['update_norm'] > 0
  b = trainer.state.params['layers']['mlp']['up']['lora_b']
  assert np.max(np.abs(np.asarray(b))) > 0
  # The base is the loaded policy, bit for bit, and is not part of the trained state.
  for got, want in zip(jax.tree.leaves(trainer.frozen.base), jax.tree.leaves(base)):
    np.testing.assert_array_equal(np.asarray(got), want)
  assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))
  # The checkpoint holds the adapters and their optimiser state only.
  stored = trainer.ckpt.manager.item_metadata(1)['state']
  keys = {k[-1] for k in checkpoints._shapes(stored) if k[0] in ('params', 'opt_state')}  # pylint: disable=protected-access
  assert keys <= {'lora_a', 'lora_b', 'count'}, keys
  # The parameter-space diagnostics ran (on adapter gradients) beside the update.
  assert 'diag/energy_b0' in metrics
  # The ledger keeps the merged policy before each update (a plain policy for replay): before
  # the first, the base itself (B = 0).
  _, before = ledger_lib.load(str(tmp_path / 'run'), 1).params(0)
  for got, want in zip(jax.tree.leaves(before), jax.tree.leaves(base)):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


@pytest.mark.slow  # two trainers, ~2 min on a loaded 2-core CPU
def test_step_1_samples_exactly_what_full_fine_tuning_samples(tmp_path):
  """B = 0: the LoRA policy at step 1 is the base, so its rollouts, rewards and behaviour
  log-probs equal those of the full fine-tuning run of the same seed, exactly."""
  _, (lora_metrics,), (lora_rollout,) = _step_1(_config(), str(tmp_path / 'lora'))
  _, (full_metrics,), (full_rollout,) = _step_1(_config(**{'lora.rank': 0}), str(tmp_path / 'full'))
  np.testing.assert_array_equal(lora_rollout.tokens_BL, full_rollout.tokens_BL)
  np.testing.assert_array_equal(lora_rollout.rewards_B, full_rollout.rewards_B)
  np.testing.assert_array_equal(lora_rollout.sampler_logps_BT, full_rollout.sampler_logps_BT)
  # The behaviour pass too (its mismatch to the sampler); the updates then differ.
  for key in ('mismatch/max_abs', 'mismatch/mean', 'adv/adv_std'):
    assert lora_metrics[key] == full_metrics[key], key
  # Known negative: different trained parameters, so different norms.
  assert lora_metrics['param_norm'] != pytest.approx(full_metrics['param_norm'], rel=1e-2)


@pytest.mark.slow  # five trainers, ~5 min on a loaded 2-core CPU
def test_each_lora_member_is_the_single_lora_run_of_its_seed(tmp_path):
  """4 members sharing one base: member i's rollouts and rewards equal the single LoRA run of
  seed + i; loss and grad_norm within 1e-5."""
  pop_config = _config(**{'population.size': 4, 'optim.minibatch_prompts': 1})
  trainer, metrics, rollouts = _step_1(pop_config, str(tmp_path / 'pop'))
  # One base, no member axis; the adapters carry it.
  kernel = trainer.frozen.base['layers']['mlp']['up']['kernel']
  assert kernel.ndim == 3
  assert trainer.state.params['layers']['mlp']['up']['lora_a'].shape[0] == 4
  for m in population_lib.members(pop_config):
    single = population_lib.member_config(pop_config, m)
    _, (want,), (want_rollout,) = _step_1(single, str(tmp_path / m.name))
    got, got_rollout = metrics[m.index], rollouts[m.index]
    np.testing.assert_array_equal(got_rollout.tokens_BL, want_rollout.tokens_BL)
    np.testing.assert_array_equal(got_rollout.rewards_B, want_rollout.rewards_B)
    np.testing.assert_allclose(got['grad_norm'], want['grad_norm'], rtol=1e-5)
    np.testing.assert_allclose(got['update_norm'], want['update_norm'], rtol=1e-5)
    for key in ('loss', 'pg_loss'):
      np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
  assert len({r.tokens_BL.tobytes() for r in rollouts}) == 4  # the members differ


@pytest.mark.parametrize('overrides, match', [
    ({
        'lora.targets': 'q,lm_head'
    }, "unknown target 'lm_head'; valid"),
    ({
        'population.size': 2,
        'population.vary': 'lora.rank=4,8'
    }, "'lora.rank' cannot vary"),
    ({
        'population.size': 2,
        'population.vary': 'lora.alpha=4,8'
    }, "'lora.alpha' cannot vary"),
])
def test_bad_lora_input_is_named_before_compute(overrides, match):
  with pytest.raises(ValueError, match=match):
    config_check.validate(_config(**overrides))


def test_a_rank_too_large_for_the_policy_is_named_before_compute(tmp_path):
  with pytest.raises(ValueError, match=r"rank=200 exceeds target 'q'.* at most 128"):
    trainer_lib.Trainer(_config(**{'lora.rank': 200}), str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints')


def _recorded(tmp_path, c):
  workdir = str(tmp_path / 'w')
  os.makedirs(workdir, exist_ok=True)
  workdir_lib.record_config(workdir, c, c.num_steps)
  return workdir


@pytest.mark.parametrize('key, value', [('lora.rank', 8), ('lora.rank', 0),
                                        ('lora.targets', 'q,v')])
def test_a_workdir_never_resumes_other_adapters(tmp_path, key, value):
  workdir = _recorded(tmp_path, _config())
  with pytest.raises(workdir_lib.WorkdirError, match='other LoRA adapters'):
    workdir_lib.check_identity(workdir, _config(**{key: value}), allow_changes=True,
                               has_checkpoint=True)


def test_a_run_recorded_before_lora_existed_resumes_at_rank_0(tmp_path):
  old = ml_collections.ConfigDict(_config(**{'lora.rank': 0}).to_dict())
  del old['lora']
  workdir = _recorded(tmp_path, old)
  workdir_lib.check_identity(workdir, _config(**{'lora.rank': 0}), has_checkpoint=True)
  with pytest.raises(workdir_lib.WorkdirError, match='other LoRA adapters'):
    workdir_lib.check_identity(workdir, _config(), allow_changes=True, has_checkpoint=True)


@pytest.mark.slow  # three processes of a 2-member population, ~5 min on a loaded 2-core CPU
def test_a_lora_population_killed_and_resumed_equals_an_uninterrupted_one(tmp_path):
  """SIGKILL after the step-1 checkpoint, then the same command: every member's metrics equal
  the uninterrupted population's (the adapters, their optimiser state, data and PRNG resume)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  cmd = lambda workdir: [
      sys.executable, '-m', 'jtc.train', '--config=configs/dfpo_min_replace.py:smoke',
      f'--workdir={workdir}', '--config.num_steps=3', '--config.population.size=2',
      '--config.lora.rank=4', '--config.eval.every=3'
  ]
  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  proc = procs.run(cmd(whole), f'{whole}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0, proc
  ended = procs.kill_after_checkpoint(cmd(killed), killed, 1, cwd=REPO, env=env)
  assert ended.returncode == -9, ended
  proc = procs.run(cmd(killed), f'{killed}.stderr.log', cwd=REPO, env=env)
  assert proc.returncode == 0 and 'resumed from step' in proc.stderr, proc
  a, b = _members(whole), _members(killed)
  assert sorted(a) == sorted(b) == ['seed0', 'seed1']
  for name in a:
    assert [r['step'] for r in a[name]] == [r['step'] for r in b[name]] == [0, 1, 2, 3]
    for ra, rb in zip(a[name], b[name]):
      assert ra.keys() == rb.keys()
      for k in ra:
        np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=f'{name} {k}')


def _members(workdir):
  nondeterministic = ('time_', 'tokens_per_s')
  return {
      os.path.basename(d): [{
          k: v for k, v in r.items() if not k.startswith(nondeterministic)
      } for r in metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))
                           ] for d in metric_writer.run_dirs(workdir)
  }
