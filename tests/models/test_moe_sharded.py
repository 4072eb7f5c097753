"""A mixture of experts' sorted forms on a sharded batch (`jtc.models.moe.rows_local`): 8
simulated CPU devices (in a subprocess) match one device, and each batch shard sorts its own
(token, expert) pairs."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MOE_ROWS_CHILD = textwrap.dedent('''
    import re
    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update('jax_default_matmul_precision', 'highest')
    from jtc.models import logprobs
    from jtc.models import model as model_lib
    from jtc.rl import sharding

    assert len(jax.devices()) == 8, jax.devices()
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    B, P, T = 8, 6, 5
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(2, 64, size=(B, P + T)), jnp.int32)
    mask = jnp.asarray((np.arange(P + T)[None] >= rng.integers(0, P, size=(B, 1))).astype(np.int32))
    comp_mask = jnp.ones((B, T), jnp.int32)
    b_sh = lambda x: sharding.batch_sharding(mesh, x.shape)
    cs = sharding.RowSharding(mesh)
    for impl in ('ragged', 'blocks'):
      moe_config = model_lib.ModelConfig.tiny_moe(vocab_size=64, n_layers=1, d_model=32, n_heads=4,
                                                  n_kv_heads=2, head_dim=8, n_experts=4,
                                                  d_expert=16, moe_impl=impl)
      moe_params = model_lib.init_params(moe_config, jax.random.key(2))

      def moe_loss(params, tokens, mask, comp_mask, rows):
        out = logprobs.sequence_logprobs(params, moe_config, tokens, mask, completion_start=P,
                                         vocab_chunk=16, row_sharding=rows)
        return jnp.sum(-out['logps'] * comp_mask) / jnp.sum(comp_mask)

      want = jax.jit(jax.value_and_grad(moe_loss), static_argnums=4)(moe_params, tokens, mask,
                                                                      comp_mask, None)
      moe_fn = jax.jit(jax.value_and_grad(moe_loss), static_argnums=4,
                       in_shardings=(sharding.param_shardings(moe_params, mesh), b_sh(tokens),
                                     b_sh(mask), b_sh(comp_mask)))
      moe_args = (sharding.shard_params(moe_params, mesh),
                  *sharding.shard_batch((tokens, mask, comp_mask), mesh))
      got = moe_fn(*moe_args, cs)
      jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                             got, want)
      pair_sorts = lambda rows: set(re.findall(r'= \\(s32\\[(\\d+)\\]\\{0\\}[^=]*\\) sort\\(', moe_fn.lower(
          *moe_args, rows).compile().as_text()))
      pairs = B * (P + T) * moe_config.experts_per_token
      print(impl, pair_sorts(cs), pair_sorts(None))
      assert pair_sorts(cs) == {str(pairs // 4)} and str(pairs) in pair_sorts(None)
    print('MOE_ROWS_OK')
''')


@pytest.mark.slow
def test_moe_rows_sorted_per_shard_equal_one_device():
  """A mixture of experts' sorted forms ('ragged', 'blocks') on 8 host devices (data 2 x fsdp 2 x
  tensor 2): with the rows' mesh (`RowSharding`) each batch shard sorts its own pairs (every 1-D
  sort of the compiled program is over B L W / 4 pairs; the control without it sorts all B L W
  on every device) and the log-probs' value and gradients equal one device's."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', MOE_ROWS_CHILD], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0 and 'MOE_ROWS_OK' in proc.stdout, proc.stderr[-5000:]
