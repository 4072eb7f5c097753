"""The trainer on 8 simulated CPU devices gives the same metrics as on one device.

Two subprocesses run the same smoke config from the same tiny policy: one with
`XLA_FLAGS=--xla_force_host_platform_device_count=8` and a (data=2, fsdp=2, tensor=2) mesh
(parameters and AdamW state sharded over fsdp and tensor, rollout batches over data x fsdp),
one on a single device. Every logged metric (rewards, losses, gradient/parameter norms, clip
fractions, evaluation accuracy, compute counters) must agree to float tolerance: sharding
changes only the order of floating-point reductions.
"""

import os
import sys

import jax
import numpy as np
import pytest

from tests import procs
from jtc.models import bundles

from jtc.analysis import metric_writer
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NONDETERMINISTIC = ('time_', 'tokens_per_s')

_PROBE = ('import jax, json; from jtc.rl import sharding; from configs import gspo; '
          'c = gspo.get_config("smoke"); '
          'print(json.dumps(dict(n=jax.device_count(), mesh=sharding.mesh_sizes(**c.mesh))))')


@pytest.fixture(scope='module')
def tiny_policy(tmp_path_factory):
  spec = {'kind': 'char'}
  tok = tokenizer_lib.from_spec(spec)
  config = model_lib.ModelConfig.tiny(vocab_size=tok.vocab_size, n_layers=2)
  params = model_lib.init_params(config, jax.random.key(0))
  path = str(tmp_path_factory.mktemp('policy') / 'bundle')
  bundles.save_policy_bundle(path, model_config=config, params=params, tokenizer_spec=spec)
  return path


def _run(workdir, policy, n_devices, *mesh):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  flags = [
      f for f in env.get('XLA_FLAGS', '').split()
      if not f.startswith('--xla_force_host_platform_device_count')
  ]
  env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={n_devices}'])
  cmd = [
      sys.executable,
      '-m',
      'jtc.train',
      '--config=configs/gspo.py:smoke',
      f'--workdir={workdir}',
      f'--config.policy.init={policy}',
      '--config.num_steps=2',
      '--config.optim.minibatch_prompts=1',
      '--config.log.diagnostics_every=1',
      # A random policy earns no reward: the entropy bonus and a KL term (with its frozen,
      # sharded reference policy) make the compared updates non-trivial.
      '--config.loss.hparams.entropy_coef=0.01',
      '--config.loss.hparams.kl_coef=0.01',
      *mesh
  ]
  proc = procs.run(cmd, f'{workdir}.stderr.log', cwd=REPO, env=env)
  if proc.returncode:
    raise AssertionError(proc)
  return proc.stderr, [
      metric_writer.read_jsonl(os.path.join(d, 'metrics.jsonl'))
      for d in metric_writer.run_dirs(workdir)
  ]


def _assert_same(one, other):
  assert [r['step'] for r in one] == [r['step'] for r in other] == [0, 1, 2]
  for a, b in zip(one, other):
    keys = {k for k in a if not k.startswith(NONDETERMINISTIC)}
    assert keys == {k for k in b if not k.startswith(NONDETERMINISTIC)}
    for k in sorted(keys):
      np.testing.assert_allclose(b[k], a[k], rtol=2e-4, atol=1e-5, err_msg=f'step {a["step"]} {k}')
  assert one[-1]['grad_norm'] > 0 and one[-1]['kl'] > 0  # the compared updates are not trivial


@pytest.mark.slow  # 1.5 min; tests/rl/test_sharding.py covers 8 devices in CI
def test_eight_devices_match_one_device(tiny_policy, tmp_path):
  log, (one,) = _run(str(tmp_path / 'one'), tiny_policy, 1)
  assert "'data': 1, 'fsdp': 1, 'tensor': 1" in log
  log, (eight,) = _run(str(tmp_path / 'eight'), tiny_policy, 8, '--config.mesh.data=2',
                       '--config.mesh.fsdp=2', '--config.mesh.tensor=2')
  assert "'data': 2, 'fsdp': 2, 'tensor': 2" in log
  _assert_same(one, eight)


LR_MEMBERS = ('--config.population.size=2',
              '--config.population.vary=optim.learning_rate=1e-3,2e-3')
LORA_MEMBERS = ('--config.population.size=2', '--config.lora.rank=4')


@pytest.mark.slow  # 1-2 min each; tests/rl/test_population.py keeps a population's equivalence in CI
@pytest.mark.parametrize('members, n', [(LR_MEMBERS, 4), (LORA_MEMBERS, 2)], ids=['lr', 'lora'])
def test_a_population_sharded_over_devices_matches_one_device(members, n, tiny_policy, tmp_path):
  """Members on the 'population' mesh axis of 4 devices (2 seeds x 2 rates, or 2 LoRA members
  (`jtc.models.lora`) whose shared base is replicated over the axis and is their KL reference),
  the batch of each over the other 2 devices' data axis: every member's metrics of the
  one-device program."""
  log, one = _run(str(tmp_path / 'one'), tiny_policy, 1, *members)
  log, four = _run(str(tmp_path / 'four'), tiny_policy, 4, *members, '--config.mesh.population=2',
                   '--config.mesh.data=2')
  assert "'population': 2, 'data': 2" in log and f'{n} population members' in log
  assert len(one) == len(four) == n
  for a, b in zip(one, four):
    _assert_same(a, b)


def test_mesh_sizes_resolve_and_reject():
  from jtc.rl import sharding  # pylint: disable=import-outside-toplevel
  assert sharding.mesh_sizes(-1, 2, 2, n_devices=8) == {
      'population': 1,
      'data': 2,
      'fsdp': 2,
      'expert': 1,
      'tensor': 2
  }
  assert sharding.mesh_sizes(1, -1, 1, population=2, n_devices=8)['fsdp'] == 4
  assert sharding.mesh_sizes(1, 1, 2, expert=-1, n_devices=8)['expert'] == 4
  with pytest.raises(ValueError, match='mesh'):
    sharding.mesh_sizes(3, 2, 2, n_devices=8)
  with pytest.raises(ValueError, match='at most one -1'):
    sharding.mesh_sizes(-1, -1, 2, n_devices=8)
