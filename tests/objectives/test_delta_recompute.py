"""Tests of jtc.objectives.delta_recompute: DelTA's coefficients from hidden states recomputed a
chunk of rows at a time equal those from the behaviour pass's held hidden states (float32
round-off), the row chunks are a permutation that comes back in order, and with the rows over 4
CPU devices the recomputing pass gathers no row of the batch."""
import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig
from jtc.objectives import delta
from jtc.objectives import delta_recompute
from jtc.objectives import token_weights
from jtc.rl import rollout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, P, T, G = 8, 4, 6, 4


def _batch(seed=0):
  """A tiny policy, [prompt | completion] rows (one left-padded), advantages of both signs, a
  ragged mask."""
  config = ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                            head_dim=8)
  params = model_lib.init_params(config, jax.random.key(seed))
  r = np.random.default_rng(seed)
  tokens = jnp.asarray(r.integers(1, 37, (B, P + T)), jnp.int32)
  input_mask = jnp.ones((B, P + T), jnp.int32).at[0, :2].set(0)
  adv = jnp.asarray(r.standard_normal(B), jnp.float32)
  mask = jnp.asarray(np.arange(T)[None] < r.integers(2, T + 1, B)[:, None], jnp.float32)
  return config, params, tokens, input_mask, adv, mask


@pytest.fixture(scope='module')
def batch():
  config, params, tokens, input_mask, adv, mask = _batch()
  out = jax.jit(
      functools.partial(rollout.behaviour_pass, model_config=config, completion_start=P,
                        return_hidden=True))(params, tokens, input_mask)
  return config, params, tokens, input_mask, adv, mask, out


@pytest.mark.parametrize('options, chunk_rows', [
    (dict(scope='group', num_refine=0), 2),
    pytest.param(dict(scope='group', num_refine=2, chunk_size=5), 4, marks=pytest.mark.slow),
    pytest.param(dict(), 4, marks=pytest.mark.slow),
    pytest.param(dict(within_side_only=True, gamma=1.0), 0, marks=pytest.mark.slow),
])
def test_recomputed_hidden_states_give_the_held_coefficients(batch, options, chunk_rows):
  config, params, tokens, input_mask, adv, mask, out = batch
  o = delta.DeltaOptions(**options)
  coefficients = functools.partial(delta.token_coefficients, options=o, group_size=G)
  held = jax.jit(coefficients)(out['hidden'], out['logps'], adv, mask)
  forward = functools.partial(delta_recompute.behaviour_forward, model_config=config,
                              completion_start=P)
  hidden = delta_recompute.RecomputedHidden(
      params=params, inputs=dict(tokens_BL=tokens, input_mask_BL=input_mask, replay_BLYW=None),
      forward=forward, length=T, dim=config.d_model, chunk_rows=chunk_rows)
  assert hidden.shape == out['hidden'].shape
  recomputed = jax.jit(coefficients)(hidden, out['logps'], adv, mask)
  assert np.ptp(np.asarray(held[0])) > 0.05  # non-degenerate: the scores vary
  np.testing.assert_allclose(recomputed[0], held[0], rtol=1e-6, atol=1e-6)
  assert held[1].keys() == recomputed[1].keys()
  for k, v in held[1].items():
    np.testing.assert_allclose(recomputed[1][k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_row_chunks_are_strided_and_come_back_in_row_order():
  x_B2 = jnp.arange(24).reshape(12, 2)
  chunks_nB2 = delta_recompute.to_chunks(x_B2, 3)
  assert chunks_nB2.shape == (3, 4, 2)
  # Chunk i holds rows i, i + 3, i + 6, ...: each contiguous block of rows meets every chunk.
  np.testing.assert_array_equal(chunks_nB2[1, :, 0], x_B2[1::3, 0])
  np.testing.assert_array_equal(delta_recompute.from_chunks(chunks_nB2), x_B2)
  assert delta_recompute.rows_per_chunk(12, 4) == 4
  assert delta_recompute.rows_per_chunk(12, 5) == 12  # not a divisor: all rows at once
  assert delta_recompute.rows_per_chunk(12, 0) == 12


def test_a_bad_hidden_mode_is_refused_with_the_valid_ones():
  with pytest.raises(ValueError, match=r"config.delta.hidden='kept'.*\['held', 'recomputed'\]"):
    token_weights.check_hidden('kept')
  with pytest.raises(ValueError, match='forward'):
    token_weights.DeltaWeighter(delta.DeltaOptions(), group_size=G, model_config=None,
                                hidden='recomputed')
  assert not token_weights.DeltaWeighter(delta.DeltaOptions(), group_size=G, model_config=None,
                                         hidden='recomputed', forward=abs).needs_hidden


CHILD = textwrap.dedent(r'''
    import functools, json, os, re
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               ' --xla_force_host_platform_device_count=4')
    os.environ['JAX_PLATFORMS'] = 'cpu'
    import jax
    import numpy as np
    from jtc.objectives import delta, delta_recompute
    from jtc.rl import rollout, sharding
    from tests.objectives.test_delta_recompute import _batch, P, T, G

    config, params, tokens, input_mask, adv, mask = _batch()
    held = rollout.behaviour_pass(params, tokens, input_mask, model_config=config,
                                  completion_start=P, return_hidden=True)
    o = delta.DeltaOptions(scope='group')
    want = delta.token_coefficients(held['hidden'], held['logps'], adv, mask, o, group_size=G)
    mesh = sharding.make_mesh(data=4, fsdp=1)
    rows = sharding.RowSharding(mesh)
    forward = functools.partial(delta_recompute.behaviour_forward, model_config=config,
                                completion_start=P, row_sharding=rows)

    def coefficients(params, tokens, input_mask, logps, adv, mask):
      hidden = delta_recompute.RecomputedHidden(
          params=params, inputs=dict(tokens_BL=tokens, input_mask_BL=input_mask,
                                     replay_BLYW=None), forward=forward, length=T,
          dim=config.d_model, chunk_rows=4)
      return delta.token_coefficients(hidden, logps, adv, mask, o, group_size=G,
                                      row_sharding=rows)

    args = jax.device_put((tokens, input_mask, held['logps'], adv, mask),
                          rows((tokens, input_mask, held['logps'], adv, mask)))
    fn = jax.jit(coefficients)
    text = fn.lower(params, *args).compile().as_text()
    lam, metrics = fn(params, *args)
    GATHER = r'= [a-z0-9]+\[[0-9,]*\]\{[^}]*\} all-gather\('
    gathers = re.findall(GATHER, text)
    # Known positive for the detector: the tokens constrained whole onto every device.
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    control = jax.jit(lambda x: jax.lax.with_sharding_constraint(x, whole) * 2)
    control = re.findall(GATHER, control.lower(args[0]).compile().as_text())
    print('RESULT ' + json.dumps(dict(
        err=float(np.max(np.abs(np.asarray(lam) - np.asarray(want[0])))),
        metric_err=max(abs(float(metrics[k]) - float(want[1][k])) / max(1, abs(float(want[1][k])))
                       for k in metrics),
        spec=str(lam.sharding.spec), gathers=gathers, control=control)))
''')


@pytest.mark.slow
def test_sharded_recomputation_keeps_the_rows_on_their_devices():
  """Rows over 4 devices, 2 chunks of 4 rows (one row of each chunk per device): the
  coefficients equal the one-device held pass's and the program all-gathers nothing (the
  parameters are replicated at fsdp = 1, so any all-gather would move rows)."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True, env=env,
                        cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith('RESULT '))[7:])
  assert out['err'] < 1e-6 and out['metric_err'] < 1e-5, out
  assert "'data'" in out['spec'], out['spec']
  assert len(out['control']) == 1, out['control']  # the detector sees a gather of rows
  assert out['gathers'] == [], out['gathers']


@pytest.mark.slow
def test_a_population_recomputes_each_members_own_hidden_states():
  """Mapped over 2 members (their own parameters, rows and advantages, as `Population.map`
  maps the plug-in): each member's recomputed coefficients are its held ones."""
  members = [_batch(seed) for seed in (0, 1)]
  config = members[0][0]
  stack = lambda i: jax.tree.map(lambda *xs: jnp.stack(xs), *[m[i] for m in members])
  params, tokens, input_mask, adv, mask = (stack(i) for i in range(1, 6))
  o = delta.DeltaOptions(scope='group')
  forward = functools.partial(delta_recompute.behaviour_forward, model_config=config,
                              completion_start=P)

  def member(params, tokens, input_mask, adv, mask):
    out = rollout.behaviour_pass(params, tokens, input_mask, model_config=config,
                                 completion_start=P, return_hidden=True)
    hidden = delta_recompute.RecomputedHidden(
        params=params, inputs=dict(tokens_BL=tokens, input_mask_BL=input_mask, replay_BLYW=None),
        forward=forward, length=T, dim=config.d_model, chunk_rows=2)
    held = delta.token_coefficients(out['hidden'], out['logps'], adv, mask, o, group_size=G)
    recomputed = delta.token_coefficients(hidden, out['logps'], adv, mask, o, group_size=G)
    return held[0], recomputed[0]

  held, recomputed = jax.jit(jax.vmap(member))(params, tokens, input_mask, adv, mask)
  assert np.ptp(np.asarray(held[0] - held[1])) > 0.05  # the members differ
  np.testing.assert_allclose(recomputed, held, rtol=1e-6, atol=1e-6)
