"""Tests for jtc.models.moe_dispatch: the all-to-all form equals the single-device form (output and
gradients, with and without routing replay) on 2 and 4 host devices (in a subprocess), its program
has an all-to-all and the replicated one none; bad settings are named before any compute."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from jtc.models import moe
from jtc.models import moe_dispatch
from jtc.models.model_config import ModelConfig
from jtc.rl import checkpoints
from jtc.rl import sharding
from tests.plan import real_configs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent('''
    import dataclasses
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update('jax_default_matmul_precision', 'highest')
    from jax.sharding import NamedSharding, PartitionSpec
    from jtc.models import moe
    from jtc.models import moe_dispatch
    from jtc.models.model_config import ModelConfig
    from jtc.rl import sharding

    CASES = [(int(n), replay == 'replay', impl) for n, replay, impl in
             (case.split(':') for case in sys.argv[1].split(','))]
    config = ModelConfig.tiny(vocab_size=64, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1,
                              head_dim=8, n_experts=4, experts_per_token=2, d_expert=8)

    def inputs():  # one program, not a dozen of eager ones
      x_BLD = jax.random.normal(jax.random.key(1), (2, 5, 16))  # U = 10: padded on 4 devices
      # Replay: the last 3 tokens of each row routed to two distinct random experts.
      first_BL = jax.random.randint(jax.random.key(2), (2, 5), 0, 4)
      replay_BLW = jnp.where((jnp.arange(5) >= 2)[None, :, None],
                             jnp.stack([first_BL, (first_BL + 1) % 4], -1), -1)
      return moe.init_ffn(config, jax.random.key(0)), x_BLD, replay_BLW

    p, x_BLD, replay_BLW = jax.jit(inputs)()

    def loss(p, x_BLD, replay_BLW, config):
      y_BLD, _ = moe.feed_forward(p, x_BLD, config, replay_BLW=replay_BLW)
      return jnp.sum(jnp.sin(y_BLD) * jnp.arange(16.0)), y_BLD

    grad = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    for n, replay, impl in CASES:
      one = dataclasses.replace(config, moe_impl=impl)
      a2a = dataclasses.replace(one, moe_dispatch='all_to_all')
      mesh = sharding.make_mesh(data=1, fsdp=4 // n, expert=n, tensor=1)
      put = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec('expert')))
      p_sharded = {k: jax.tree.map(put, v) if k.startswith('expert_') else v for k, v in p.items()}
      args = (x_BLD, replay_BLW if replay else None)
      want = jax.jit(grad, static_argnums=3)(p, *args, one)  # one device (device 0)
      with jax.set_mesh(mesh):
        compiled = jax.jit(grad, static_argnums=3).lower(p_sharded, *args, a2a).compile()
        got = compiled(p_sharded, *args)
      for a, b in zip(jax.device_get(jax.tree.leaves(want)), jax.device_get(jax.tree.leaves(got))):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-6 * np.max(np.abs(a)))
      assert 'all-to-all' in compiled.as_text(), 'the exchange is an all-to-all'
      if n == 2:  # the replicated form on the same mesh exchanges nothing
        with jax.set_mesh(mesh):
          hlo = jax.jit(loss, static_argnums=3).lower(p_sharded, *args, one).compile().as_text()
        assert 'all-to-all' not in hlo
      print('CASE_OK', n, replay, impl)
''')


def _run_child(cases):
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             XLA_FLAGS='--xla_force_host_platform_device_count=4', JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', CHILD, ','.join(cases)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.count('CASE_OK') == len(cases), proc.stderr[-5000:]


def test_all_to_all_equals_one_device_on_2_devices_with_replay():
  """Output and gradients (experts, router, input) of the all-to-all form within float32
  round-off of one device, on 2 devices (x 2 on fsdp) with routing replay; an all-to-all in its
  program, none in the replicated form's."""
  _run_child(['2:replay:ragged'])


@pytest.mark.slow  # seven more compiles of the pair
def test_all_to_all_equals_one_device_on_2_and_4_devices_with_and_without_replay():
  """The same on 2 and 4 devices (10 tokens: padded to 12 on 4), replay on and off, each local
  expert form ('ragged', 'blocks')."""
  _run_child([
      f'{n}:{replay}:{impl}' for n in (2, 4) for replay in ('replay', 'none')
      for impl in ('ragged', 'blocks') if (n, replay, impl) != (2, 'replay', 'ragged')
  ])


@pytest.mark.slow  # CI time: the 2-device test covers the path
def test_one_device_mesh_is_the_plain_form():
  """On a mesh whose expert axis is 1 device the exchange is the identity: the sort into slots,
  the padding and the return equal the plain form exactly."""
  c = ModelConfig.tiny(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, n_experts=4,
                       experts_per_token=2, d_expert=8, moe_impl='dense')
  a2a = dataclasses.replace(c, moe_dispatch='all_to_all')

  def both():
    p = moe.init_ffn(c, jax.random.key(0))
    x_BLD = jax.random.normal(jax.random.key(1), (2, 3, 16))
    return moe.feed_forward(p, x_BLD, c)[0], moe.feed_forward(p, x_BLD, a2a)[0]

  mesh = sharding.make_mesh(data=1, fsdp=1, expert=1, tensor=1, devices=jax.devices()[:1])
  with moe_dispatch.mesh_context(mesh, a2a):
    want, got = jax.jit(both)()
  assert jnp.array_equal(got, want)


def test_bad_dispatch_settings_are_named():
  with pytest.raises(ValueError, match=r"moe_dispatch='ring' is not one of \['replicated', "):
    ModelConfig.tiny_moe(moe_dispatch='ring')
  c = ModelConfig.tiny_moe(n_layers=1, moe_dispatch='all_to_all')
  x_BLD = jnp.zeros((1, 2, c.d_model))
  with pytest.raises(ValueError, match="moe_dispatch='all_to_all' needs a device mesh"):
    jax.eval_shape(lambda: moe.feed_forward(moe.init_ffn(c, jax.random.key(0)), x_BLD, c))
  from configs import common  # pylint: disable=import-outside-toplevel
  policy = common.get_config().policy
  policy.moe_dispatch = 'a2a'
  with pytest.raises(ValueError, match=r"config.policy.moe_dispatch='a2a' is not one of"):
    checkpoints.check_policy_config(policy)
  mesh = sharding.make_mesh(data=1, fsdp=1, expert=1, tensor=1, devices=jax.devices()[:1])
  with moe_dispatch.mesh_context(mesh, ModelConfig.tiny_moe()):  # replicated: no mesh set
    assert jax.sharding.get_abstract_mesh().empty
  with moe_dispatch.mesh_context(mesh, c):
    assert jax.sharding.get_abstract_mesh().shape['expert'] == 1
  assert jax.sharding.get_abstract_mesh().empty


PLAN_AND_TRAIN_CHILD = textwrap.dedent('''
    import sys
    import jax
    from configs import dfpo_min_replace
    from jtc.plan import hardware, planner

    platform, data, stage = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    devices = jax.devices() if platform == 'cpu' else hardware.topology_devices('v5e:2x2')
    for dispatch in ('all_to_all', 'replicated'):
      c = dfpo_min_replace.get_config('smoke')
      c.policy.init, c.mesh.data, c.mesh.expert = sys.argv[1], data, 2
      c.policy.moe_dispatch = dispatch
      p = planner.plan(c, devices, platform=platform, chip=hardware.CHIPS['v5e'],
                       target='test', compiled_for='test', only=(stage,))
      (row,) = p.rows
      print('A2A_BYTES', dispatch, row.costs.collective_bytes['all-to-all'])
''')


def _tiny_moe_policy(path):
  from jtc.models import bundles  # pylint: disable=import-outside-toplevel
  from jtc.models import model as model_lib  # pylint: disable=import-outside-toplevel
  from jtc.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  spec = {'kind': 'char'}
  config = ModelConfig.tiny_moe(vocab_size=tokenizer_lib.from_spec(spec).vocab_size, n_layers=2,
                                d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, n_experts=4,
                                d_expert=16)
  bundles.save_policy_bundle(path, model_config=config,
                             params=model_lib.init_params(config,
                                                          jax.random.key(0)), tokenizer_spec=spec)
  return path


def _plan_child(policy, env, platform, data, stage):
  """{dispatch: all-to-all bytes of ``stage``} planned on mesh.expert = 2."""
  proc = subprocess.run(
      [sys.executable, '-c', PLAN_AND_TRAIN_CHILD, policy, platform,
       str(data), stage], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  return {
      d: float(b)
      for d, b in (line.split()[1:] for line in proc.stdout.splitlines() if line.startswith('A2A'))
  }


@real_configs.needs_libtpu
@pytest.mark.slow  # two compiles of the behaviour pass for a deviceless TPU slice
def test_jtc_plan_compiles_the_exchange_for_a_tpu_slice(tmp_path):
  """`jtc plan` on v5e:2x2 (data 2 x expert 2, libtpu): the behaviour pass moves bytes by
  all-to-all with moe_dispatch='all_to_all' and none with 'replicated'."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
  moved = _plan_child(_tiny_moe_policy(str(tmp_path / 'policy')), env, 'tpu', 2, 'behaviour')
  assert moved['all_to_all'] > 0 and moved['replicated'] == 0, moved


@pytest.mark.slow  # two update compiles and a 2-step trainer run on 2 host devices: ~3 min
def test_the_planner_and_the_trainer_run_the_exchange(tmp_path):
  """`jtc plan`'s update stage of a tiny MoE policy on mesh.expert = 2 host devices moves bytes
  by all-to-all with moe_dispatch='all_to_all' and none with 'replicated'; a 2-step RL run with
  routing replay trains on it and logs the routing metrics."""
  from jtc.analysis import metric_writer  # pylint: disable=import-outside-toplevel
  policy = _tiny_moe_policy(str(tmp_path / 'policy'))
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             XLA_FLAGS='--xla_force_host_platform_device_count=2', JAX_PLATFORMS='cpu')
  moved = _plan_child(policy, env, 'cpu', 1, 'update')
  assert moved['all_to_all'] > 0 and moved['replicated'] == 0, moved
  workdir = str(tmp_path / 'run')
  proc = subprocess.run([
      sys.executable, '-m', 'jtc.train', '--config=configs/dfpo_min_replace.py:smoke',
      f'--workdir={workdir}', f'--config.policy.init={policy}', '--config.num_steps=2',
      '--config.mesh.data=1', '--config.mesh.expert=2', '--config.policy.moe_dispatch=all_to_all',
      '--config.rollout.routing_replay=behaviour', '--config.eval.every=0'
  ], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  records = metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == [1, 2]
  assert all(0 <= r['mismatch/routing_flip_rate'] <= 1 for r in records)


def test_the_planner_counts_every_peer_buffer_of_an_all_to_all():
  """`jtc.plan.hlo` reads an all-to-all's bytes from its tuple of one buffer per peer (as XLA
  writes the exchange): 2 x 16 x 16 f32, not one buffer's share; and counts each all-to-all,
  also when they share a channel id (XLA:CPU numbers a shard_map's all-to-alls alike)."""
  from jtc.plan import hlo  # pylint: disable=import-outside-toplevel
  text = textwrap.dedent('''
      ENTRY %main (p: f32[1,16,16]) -> f32[1,16,16] {
        %p = f32[1,16,16]{2,1,0} parameter(0)
        %all-to-all = (f32[1,16,16]{2,1,0}, f32[1,16,16]{2,1,0}) all-to-all(%p, %p), channel_id=1, replica_groups={{0,1}}
        %b = f32[1,16,16]{2,1,0} get-tuple-element(%all-to-all), index=0
        %all-to-all.1 = (f32[1,16,16]{2,1,0}, f32[1,16,16]{2,1,0}) all-to-all(%b, %b), channel_id=1, replica_groups={{0,1}}
        ROOT %g = f32[1,16,16]{2,1,0} get-tuple-element(%all-to-all.1), index=0
      }
  ''')
  assert hlo.program_costs(text).collective_bytes['all-to-all'] == 2 * (2 * 16 * 16 * 4)


def test_a_stored_policy_does_not_carry_its_writers_dispatch(tmp_path):
  """A bundle (or a ledger's model.json) written by an all-to-all run reads back replicated: the
  dispatch is the reader's choice (its mesh), not the file's; the policy section sets it."""
  from jtc.models import bundles  # pylint: disable=import-outside-toplevel
  c = ModelConfig.tiny_moe(n_layers=1, moe_dispatch='all_to_all')
  bundles.save_policy_bundle(str(tmp_path), model_config=c, params={}, tokenizer_spec={})
  read = bundles.read_model_config(str(tmp_path / 'model.json'))
  assert read == dataclasses.replace(c, moe_dispatch='replicated')
  from configs import common  # pylint: disable=import-outside-toplevel
  policy = common.get_config().policy
  assert checkpoints.policy_model_config(policy, c, 'cpu').moe_dispatch == 'replicated'
  policy.moe_dispatch = 'all_to_all'
  assert checkpoints.policy_model_config(policy, read, 'cpu').moe_dispatch == 'all_to_all'
