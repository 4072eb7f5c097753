"""Tests for jtc.rl.sharding: 8 simulated CPU devices (in a subprocess) match one device."""
import os
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec

from jtc.models import model as model_lib
from jtc.rl import sharding

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent('''
    import dataclasses
    import math
    import os
    import re
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               ' --xla_force_host_platform_device_count=8')
    os.environ['JAX_PLATFORMS'] = 'cpu'
    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update('jax_default_matmul_precision', 'highest')
    from jax.sharding import PartitionSpec as PS
    from jtc.models import axes
    from jtc.models import decode
    from jtc.models import logprobs
    from jtc.models import model as model_lib
    from jtc.models import sampler as sampler_lib
    from jtc.plan import hlo
    from jtc.rl import sharding

    assert len(jax.devices()) == 8, jax.devices()
    config = model_lib.ModelConfig.tiny(vocab_size=64, n_layers=1, d_model=32, n_heads=4,
                                        n_kv_heads=2, head_dim=8, d_ff=64, qk_norm=True,
                                        tie_embeddings=False)
    shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
    rng = np.random.default_rng(0)
    fan_in = lambda x: x.shape[1 if x.ndim >= 3 else 0]  # [Y, in, ...] kernels, else [in, ...]
    params = jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape) / np.sqrt(fan_in(x)), jnp.float32),
        shapes)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    p_sh = sharding.param_shardings(params, mesh)
    sharded_params = sharding.shard_params(params, mesh)
    spec = sharded_params['layers']['mlp']['gate']['kernel'].sharding.spec
    assert spec == PS(None, 'fsdp', 'tensor'), spec  # [Y, D, F]: the layer axis unsharded
    assert sharded_params['embed']['embedding'].sharding.spec == PS('tensor', 'fsdp')

    B, P, T = 8, 6, 5
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, P + 1, size=B)
    prompt_mask = (np.arange(P)[None] >= P - lengths[:, None]).astype(np.int32)
    prompt = np.where(prompt_mask, rng.integers(2, 64, size=(B, P)), 0).astype(np.int32)
    completion = rng.integers(2, 64, size=(B, T)).astype(np.int32)
    comp_mask = (np.arange(T)[None] < rng.integers(1, T + 1, size=B)[:, None]).astype(np.int32)
    tokens = jnp.asarray(np.concatenate([prompt, completion], 1))
    mask = jnp.asarray(np.concatenate([prompt_mask, comp_mask], 1))
    comp_mask = jnp.asarray(comp_mask)

    def fwd(params, tokens, mask):
      return model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask),
                               mask).logits_BLV

    def loss(params, tokens, mask, comp_mask):
      out = logprobs.sequence_logprobs(params, config, tokens, mask, completion_start=P,
                                        vocab_chunk=16)
      return jnp.sum(-out['logps'] * comp_mask) / jnp.sum(comp_mask)

    b_sh = lambda x: sharding.batch_sharding(mesh, x.shape)
    logits_1 = jax.jit(fwd)(params, tokens, mask)
    logits_8 = jax.jit(
        fwd, in_shardings=(p_sh, b_sh(tokens), b_sh(mask)),
        out_shardings=b_sh(logits_1))(sharded_params, *sharding.shard_batch((tokens, mask), mesh))
    assert len(logits_8.sharding.device_set) == 8
    np.testing.assert_allclose(logits_8, logits_1, rtol=1e-5, atol=1e-5)

    grad_fn = jax.value_and_grad(loss)
    l1, g1 = jax.jit(grad_fn)(params, tokens, mask, comp_mask)
    l8, g8 = jax.jit(
        grad_fn, in_shardings=(p_sh, b_sh(tokens), b_sh(mask), b_sh(comp_mask)),
        out_shardings=(sharding.replicated(mesh), p_sh))(
            sharded_params, *sharding.shard_batch((tokens, mask, comp_mask), mesh))
    assert g8['layers']['attn']['q']['kernel'].sharding.spec == PS(None, 'fsdp', 'tensor', None)
    np.testing.assert_allclose(l8, l1, rtol=1e-5, atol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                           g8, g1)

    kwargs = dict(rng=jax.random.key(4), num_samples=2, max_new_tokens=T, eos_id=1, pad_id=0,
                  temperature=0.8, top_k=20)
    s1 = sampler_lib.sample(params, config, jnp.asarray(prompt), jnp.asarray(prompt_mask),
                            **kwargs)
    s8 = sampler_lib.sample(sharded_params, config,
                            *sharding.shard_batch((jnp.asarray(prompt), jnp.asarray(prompt_mask)),
                                                  mesh), **kwargs)
    assert len(s8.tokens_RL.sharding.device_set) == 8
    np.testing.assert_array_equal(s8.tokens_RL, s1.tokens_RL)
    np.testing.assert_array_equal(s8.completion_mask_RT, s1.completion_mask_RT)
    np.testing.assert_allclose(s8.logps_RT, s1.logps_RT, rtol=1e-5, atol=1e-5)

    # Fewer prompts (2) than batch devices (data x fsdp = 4): with `RowSharding` the
    # completion cache's R = 8 rows still split 4 ways, per device [Y, R/4, K/2, H, T] keys;
    # without it (a constant's sharding is XLA's choice) they do not. Same samples either way.
    cs = sharding.RowSharding(mesh)
    assert cs == sharding.RowSharding(mesh) and hash(cs) == hash(sharding.RowSharding(mesh))
    few = sharding.shard_batch((jnp.asarray(prompt[:2]), jnp.asarray(prompt_mask[:2])), mesh)
    static_kw = dict(num_samples=4, max_new_tokens=T, eos_id=1, pad_id=0, temperature=0.8,
                     top_k=20, layer_loop='scan')
    s1 = sampler_lib.sample(params, config, jnp.asarray(prompt[:2]), jnp.asarray(prompt_mask[:2]),
                            rng=jax.random.key(4), **static_kw)
    s8 = sampler_lib.sample(sharded_params, config, *few, rng=jax.random.key(4), row_sharding=cs,
                            **static_kw)
    np.testing.assert_array_equal(s8.tokens_RL, s1.tokens_RL)
    np.testing.assert_allclose(s8.logps_RT, s1.logps_RT, rtol=1e-5, atol=1e-5)
    # The continuous scheduler's 4 slots (per-row lengths and prompts) split 4 ways likewise.
    s8 = sampler_lib.sample(sharded_params, config, *few, rng=jax.random.key(4), row_sharding=cs,
                            scheduler='continuous', slots=4, **static_kw)
    np.testing.assert_array_equal(s8.tokens_RL, s1.tokens_RL)
    np.testing.assert_allclose(s8.logps_RT, s1.logps_RT, rtol=1e-5, atol=1e-5)

    def per_device_keys(row_sharding, shape):
      fn, static = sampler_lib.program(config, P, members=False, platform='cpu',
                                       row_sharding=row_sharding, **static_kw)
      text = fn.lower(sharded_params, *few, jax.random.key(4), **static).compile().as_text()
      return f'f32[{shape}]' in text

    assert per_device_keys(cs, f'1,2,1,8,{T}') and not per_device_keys(None, f'1,2,1,8,{T}')

    # The decode layout: the weights resharded once per sampler call, whole over the batch axes
    # (still split over 'tensor'): the same samples, and no all-gather of a weight inside the
    # decode loop, where the training layout (fsdp 4, tensor 2, two rows per device) gathers
    # them at every step (the control).
    # Two layers: a one-layer model's weights are loop invariants XLA hoists out of the loop.
    config2 = dataclasses.replace(config, n_layers=2)
    params2 = model_lib.init_params(config2, jax.random.key(1))
    mesh4 = sharding.make_mesh(data=1, fsdp=4, tensor=2)
    sharded2 = sharding.shard_params(params2, mesh4)
    four = sharding.shard_batch((jnp.asarray(prompt[:4]), jnp.asarray(prompt_mask[:4])), mesh4)

    def compiled(decode_layout):
      """(the sampler's compiled program, its shapes all-gathered inside the decode loop: the
      entry's largest while loop)."""
      fn, static = sampler_lib.program(config2, P, members=False, platform='cpu',
                                       row_sharding=sharding.RowSharding(mesh4),
                                       decode_layout=decode_layout, **dict(static_kw, num_samples=2))
      program = fn.lower(sharded2, *four, jax.random.key(4), **static).compile()
      comps, entry = hlo.parse(program.as_text())
      loop = max((reachable(comps, re.search(r'body=%?([\\w.\\-]+)', i.rest).group(1))
                  for i in comps[entry].instrs if i.op == 'while'),
                 key=lambda names: sum(len(comps[n].instrs) for n in names))
      return program, {dims for n in loop for i in comps[n].instrs
                       if i.op.startswith('all-gather') for _, dims in hlo._arrays(i.shape)}

    def reachable(comps, name):
      seen, todo = set(), [name]
      while todo:
        name = todo.pop()
        if name not in seen and name in comps:
          seen.add(name)
          for i in comps[name].instrs:
            todo += re.findall(r'(?:calls|body|condition|to_apply)=%?([\\w.\\-]+)', i.rest)
      return seen

    def decode_shard(path, x):  # a weight's per-device shape in the decode layout (no layer axis)
      spec = sharding.logical_to_spec(axes.leaf_logical_axes(path), x.shape, mesh4,
                                      sharding.DECODE_AXIS_RULES)
      split = lambda a: math.prod(mesh4.shape[n] for n in ((a,) if isinstance(a, str) else a or ()))
      return tuple(n // split(a) for n, a in zip(x.shape, spec))[int(path[0].key == 'layers'):]

    weights = {decode_shard(p, x) for p, x in jax.tree_util.tree_flatten_with_path(params2)[0]}
    weights = {w for w in weights if len(w) > 1}  # norm scales are never split
    train, train_gathers = compiled(None)
    resharded, resharded_gathers = compiled(sharding.DecodeLayout(mesh4))
    assert weights & train_gathers, (weights, train_gathers)
    assert not weights & resharded_gathers, weights & resharded_gathers
    want, got = (p(sharded2, *four, jax.random.key(4)) for p in (train, resharded))
    np.testing.assert_array_equal(got.tokens_RL, want.tokens_RL)
    np.testing.assert_allclose(got.logps_RT, want.logps_RT, rtol=1e-5, atol=1e-5)

    cache = model_lib.init_cache(config, B, P + T)
    c_sh = sharding.cache_shardings(cache, mesh)
    assert c_sh.k.spec == PS(None, ('data', 'fsdp'), 'tensor', None, None), c_sh.k.spec
    _, group = decode.prefill(params, config, jnp.asarray(prompt), jnp.asarray(prompt_mask),
                                 num_samples=2, max_new_tokens=T)
    g_sh = sharding.cache_shardings(group, mesh)
    assert g_sh.prompt_k_YBKPH.spec == g_sh.k_YRKHT.spec == c_sh.k.spec
    assert g_sh.prompt_mask_BP.spec == PS(('data', 'fsdp'), None)
    print('SHARDING_OK')
''')


def test_sharded_equals_single_device_on_8_cpu_devices():
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', CHILD], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0 and 'SHARDING_OK' in proc.stdout, proc.stderr[-5000:]


EXPERT_CHILD = textwrap.dedent('''
    import os
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as PS
    from jtc.models import logprobs
    from jtc.models import model as model_lib
    from jtc.models import sampler as sampler_lib
    from jtc.rl import sharding

    assert len(jax.devices()) == 2, jax.devices()
    config = model_lib.ModelConfig.tiny_moe(vocab_size=64, n_layers=2, d_model=32, n_heads=4,
                                            n_kv_heads=2, head_dim=8, n_experts=4, d_expert=16,
                                            d_shared_expert=8, moe_impl='dense')
    params = model_lib.init_params(config, jax.random.key(0))
    mesh = sharding.make_mesh(data=1, fsdp=1, expert=2, tensor=1)
    p_sh = sharding.param_shardings(params, mesh)
    sharded = sharding.shard_params(params, mesh)
    spec = sharded['layers']['mlp']['expert_down']['kernel'].sharding.spec
    assert spec[:2] == (None, 'expert'), spec  # [Y, X, F, D]: the experts split
    rng = np.random.default_rng(0)
    B, P, T = 4, 6, 5
    prompt_mask = (np.arange(P)[None] >= P - rng.integers(1, P + 1, size=(B, 1))).astype(np.int32)
    prompt = np.where(prompt_mask, rng.integers(2, 64, size=(B, P)), 0).astype(np.int32)
    tokens = jnp.asarray(np.concatenate([prompt, rng.integers(2, 64, size=(B, T))], 1), jnp.int32)
    mask = jnp.asarray(np.concatenate([prompt_mask, np.ones((B, T), np.int32)], 1))

    def fwd(params):
      out = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask), mask)
      return out.logits_BLV, out.routed.experts_BLW

    one = jax.jit(fwd)(params)
    two = jax.jit(fwd, in_shardings=(p_sh,))(sharded)
    for a, b in zip(one, two):
      np.testing.assert_array_equal(a, b)  # bit-identical: each pair's output is one device's
    loss = lambda p: jnp.sum(logprobs.sequence_logprobs(p, config, tokens, mask,
                                                        completion_start=P)['logps'])
    g1 = jax.jit(jax.grad(loss))(params)
    g2 = jax.jit(jax.grad(loss), in_shardings=(p_sh,), out_shardings=p_sh)(sharded)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g2, g1)
    kw = dict(rng=jax.random.key(4), num_samples=2, max_new_tokens=T, eos_id=1, pad_id=0,
              return_routing=True)
    s1 = sampler_lib.sample(params, config, jnp.asarray(prompt), jnp.asarray(prompt_mask), **kw)
    s2 = sampler_lib.sample(sharded, config, jnp.asarray(prompt), jnp.asarray(prompt_mask), **kw)
    for name in ('tokens_RL', 'logps_RT', 'experts_RLYW'):
      np.testing.assert_array_equal(getattr(s2, name), getattr(s1, name))
    print('EXPERT_OK')
''')


@pytest.mark.slow
def test_expert_parallel_equals_one_device_bit_for_bit():
  """A mixture-of-experts policy with its experts split over mesh.expert = 2 host devices: logits,
  routed experts and samples bit-identical to one device; gradients to float rounding (the
  input's gradient sums the experts' parts across devices)."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             XLA_FLAGS='--xla_force_host_platform_device_count=2', JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', EXPERT_CHILD], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and 'EXPERT_OK' in proc.stdout, proc.stderr[-5000:]


def test_logical_to_spec_falls_back_when_not_divisible():
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  assert sharding.logical_to_spec(('embed', 'mlp'), (6, 8), mesh) == PartitionSpec('fsdp', 'tensor')

  class FakeMesh:  # only .shape is consulted
    shape = {'data': 2, 'fsdp': 4, 'tensor': 2}

  spec = lambda axes, shape: sharding.logical_to_spec(axes, shape, FakeMesh())
  assert spec(('batch', 'length'), (16, 5)) == PartitionSpec(('data', 'fsdp'), None)
  assert spec(('batch', 'length'), (6, 5)) == PartitionSpec('data', None)  # 6 % 8 != 0
  assert spec(('kv_heads', 'head_dim'), (3, 8)) == PartitionSpec(None, None)
  assert spec(('vocab', 'embed'), (64, 12)) == PartitionSpec('tensor', 'fsdp')
  with pytest.raises(ValueError, match='bogus'):
    spec(('bogus',), (4,))


def test_param_axes_cover_every_preset_parameter():
  for preset in ('tiny', 'qwen3_0_6b', 'llama3_1b'):
    config = getattr(model_lib.ModelConfig, preset)(**({'n_layers': 1}))
    shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))

    class FakeMesh:
      shape = {'data': 1, 'fsdp': 8, 'tensor': 4}

    specs = jax.tree_util.tree_map(
        lambda axes, x: sharding.logical_to_spec(axes, x.shape, FakeMesh()),
        model_lib.param_logical_axes(shapes), shapes, is_leaf=lambda x: isinstance(x, tuple))
    assert specs['layers']['attn']['q']['kernel'] == PartitionSpec(None, 'fsdp', 'tensor', None)


def test_make_mesh_validates_sizes():
  with pytest.raises(ValueError, match='mesh sizes'):
    sharding.make_mesh(data=-1, fsdp=-1)
  with pytest.raises(ValueError):
    sharding.make_mesh(data=3, fsdp=1, tensor=1, devices=jax.devices()[:1])


@pytest.mark.parametrize('env, expected', [
    ({
        'XLA_FLAGS': '--xla_force_host_platform_device_count=2'
    }, 6),
    ({
        'XLA_FLAGS': '--xla_foo=1 --xla_force_host_platform_device_count=8'
    }, 18),
    ({
        'XLA_FLAGS': '--xla_force_host_platform_device_count=1'
    }, None),
    ({}, None),
    ({
        'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
        'PJRT_NPROC': '3'
    }, None),
])
def test_several_cpu_devices_reserve_threads_for_their_collectives(env, expected):
  env = dict(env)
  kept = env.get('PJRT_NPROC')
  assert sharding.reserve_cpu_threads(env) == (None if expected is None else str(
      max(len(os.sched_getaffinity(0)), expected)))
  assert env.get('PJRT_NPROC') == (kept if expected is None else str(
      max(len(os.sched_getaffinity(0)), expected)))


@pytest.mark.parametrize('reserve', [True, False])
def test_xla_sizes_its_cpu_thread_pools_by_the_reserved_threads(reserve):
  """What `reserve_cpu_threads` relies on: this jaxlib reads $PJRT_NPROC when it creates the
  CPU client (its intra-op pool has the client pool's size and names its threads). Control:
  without it, the pools have one thread a core."""
  child = textwrap.dedent(f'''
      import os, sys
      os.environ.pop('PJRT_NPROC', None)
      os.environ.pop('NPROC', None)
      os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
      from jtc.rl import sharding
      if {reserve}:
        sharding.reserve_cpu_threads()
      import jax
      jax.devices()
      names = [open(f'/proc/self/task/{{t}}/comm').read().strip()
               for t in os.listdir('/proc/self/task')]
      print(names.count('tf_XLAEigen'))
  ''')
  proc = subprocess.run([sys.executable, '-c', child], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  cores = len(os.sched_getaffinity(0))
  assert int(proc.stdout.split()[-1]) == (max(cores, 6) if reserve else max(cores, 2))
