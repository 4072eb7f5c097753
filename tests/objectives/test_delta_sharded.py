"""DelTA's coefficient pass with the rows sharded over 2 and 4 simulated CPU devices (in a
subprocess) equals the one-device pass within 1e-6, for every scoring variant, and keeps the
rows on their devices: the compiled program gathers no device's hidden states."""
import json
import os
import re
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent(r'''
    import json, os, re
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               ' --xla_force_host_platform_device_count=4')
    os.environ['JAX_PLATFORMS'] = 'cpu'
    import functools
    import jax
    import numpy as np
    from jtc.objectives import delta
    from jtc.rl import sharding

    assert len(jax.devices()) == 4, jax.devices()
    B, T, D, G = 16, 12, 8, 4
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((B, T, D)).astype(np.float32)
    logps = -rng.exponential(1.0, (B, T)).astype(np.float32)
    adv = rng.standard_normal(B).astype(np.float32)
    adv[:G] = np.abs(adv[:G])  # a one-sided group (scope 'group': neutral weights)
    mask = (np.arange(T)[None] < rng.integers(3, T + 1, B)[:, None]).astype(np.float32)
    ids = rng.integers(0, 32, (B, T)).astype(np.int32)
    unembed = rng.standard_normal((32, D)).astype(np.float32)
    CASES = {
        'full': {},
        'group_chunked': {'scope': 'group', 'chunk_size': 48},  # 3 tokens of every row a chunk
        'within_side_fixed_gamma': {'within_side_only': True, 'num_refine': 2, 'gamma': 1.0},
        'topk_proxy': {'proxy': 'topk_hidden', 'topk': 8},
        'select_top': {'selection': 'top', 'soft_assignment': False},
    }
    GATHER = re.compile(r'= f32\[([0-9,]*)\]\{[^}]*\} all-gather\(')
    hidden_gathers = lambda text: [g for g in GATHER.findall(text) if g.endswith(f',{D}')]
    # Known positive for the detector: hidden states constrained whole onto every device.
    mesh = sharding.make_mesh(data=4, fsdp=1)
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = sharding.RowSharding(mesh)
    gather = jax.jit(lambda h: jax.lax.with_sharding_constraint(h, whole) * 2)
    out = {'control': hidden_gathers(gather.lower(jax.device_put(hidden, rows(hidden))).compile()
                                     .as_text())}
    for name, kw in CASES.items():
      options = delta.DeltaOptions(**kw)
      extra = dict(unembed_VD=unembed, token_ids_BT=ids) if options.proxy == 'topk_hidden' else {}
      results = {}
      for n in (1, 2, 4):
        mesh = sharding.make_mesh(data=n, fsdp=1, devices=jax.devices()[:n])
        rows = sharding.RowSharding(mesh)
        fn = jax.jit(functools.partial(delta.token_coefficients, options=options, group_size=G,
                                       row_sharding=rows if n > 1 else None))
        args = jax.device_put((hidden, logps, adv, mask), rows((hidden, logps, adv, mask)))
        lowered = fn.lower(*args, rng=jax.random.key(0), **extra)
        text = lowered.compile().as_text()
        lam, metrics = fn(*args, rng=jax.random.key(0), **extra)
        results[n] = dict(lam=np.asarray(lam).tolist(), spec=str(lam.sharding.spec),
                          metrics={k: float(v) for k, v in metrics.items()},
                          gathers=hidden_gathers(text))
      out[name] = results
    print('RESULT ' + json.dumps(out))
''')


def _run():
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True, env=env,
                        cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT '))
  return json.loads(line[len('RESULT '):])


def test_rows_over_2_and_4_devices_give_the_one_device_coefficients():
  import numpy as np  # pylint: disable=import-outside-toplevel
  out = _run()
  assert out.pop('control') == ['16,12,8']  # the detector finds a gather of hidden states
  for name, results in out.items():
    one = results['1']
    assert np.ptp(one['lam']) > 0.05, name  # non-degenerate: the scores vary
    for n in ('2', '4'):
      np.testing.assert_allclose(results[n]['lam'], one['lam'], rtol=1e-6, atol=1e-6,
                                 err_msg=f'{name} on {n} devices')
      for k, v in one['metrics'].items():
        np.testing.assert_allclose(results[n]['metrics'][k], v, rtol=1e-6, atol=1e-6,
                                   err_msg=f'{name} {k} on {n} devices')
      # The rows stay on their devices: the coefficients come back split like the rows, and
      # no [.., D] block of hidden states or proxies is all-gathered.
      assert re.search(r"'data'", results[n]['spec']), (name, results[n]['spec'])
      assert results[n]['gathers'] == [], (name, n, results[n]['gathers'])
