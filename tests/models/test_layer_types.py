"""Tests of jtc.models.layer_types: the segments cover the layers in order, the scan and the loop
visit every layer with its own rows (against a plain per-layer reference), a dense model keeps
one stack row per layer, and a hybrid's program does not grow with depth."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import layer_types
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig

L, F = 'linear_attention', 'full_attention'


def _expand(segments):
  return tuple(k for s in segments for _ in range(s.repeats) for k in s.pattern)


@pytest.mark.parametrize('mixers, want', [
    ((F,) * 6, [(1, 6)]),
    ((L, L, L, F) * 3, [(4, 3)]),
    ((L, L, L, F, L, L), [(1, 3), (1, 1), (1, 2)]),
    ((F, L, L, L, L, L, L, L), [(1, 1), (1, 7)]),
    ((L, F, L, F, F), [(2, 2), (1, 1)]),
])
def test_segments_cover_the_layers_in_order(mixers, want):
  kinds = tuple(layer_types.LayerKind(m) for m in mixers)
  segs = layer_types.segments(kinds)
  assert _expand(segs) == kinds
  assert [(len(s.pattern), s.repeats) for s in segs] == want
  assert [s.start for s in segs] == list(np.cumsum([0] + [p * r for p, r in want])[:-1])


def test_random_kind_sequences_are_covered():
  rng = np.random.default_rng(0)
  for _ in range(50):
    kinds = tuple(layer_types.LayerKind(m) for m in rng.choice([L, F], rng.integers(1, 13)))
    assert _expand(layer_types.segments(kinds)) == kinds


def _config(mixers):
  return ModelConfig.tiny(n_layers=len(mixers), layer_types=mixers, d_model=16, n_heads=2,
                          n_kv_heads=1, head_dim=8, d_ff=16, linear_k_head_dim=4,
                          linear_v_head_dim=4)


def test_rows_count_each_stack_in_layer_order():
  c = _config((L, F, L, L, F))
  rows = layer_types.rows(c)
  assert [r.get('attn') for r in rows] == [None, 0, None, None, 1]
  assert [r.get('linear_attn') for r in rows] == [0, None, 1, 2, None]
  assert [r['attn_norm'] for r in rows] == list(range(5))
  assert layer_types.stack_sizes(c) == {
      'attn_norm': 5,
      'linear_attn': 3,
      'mlp_norm': 5,
      'mlp': 5,
      'attn': 2
  }
  np.testing.assert_array_equal(layer_types.layers_of(c, 'attn'), [1, 4])
  assert layer_types.is_hybrid(c) and not layer_types.is_hybrid(ModelConfig.tiny())


@pytest.mark.parametrize('mixers', [(L, L, L, F) * 2, (F, L, F, F, L, L, L), (F,) * 3])
def test_scan_and_loop_visit_every_layer_with_its_rows(mixers):
  """Each layer adds its own rows' values to the carry and outputs them; the scan and the loop
  give the reference's carry sequence and stacked outputs."""
  c = _config(mixers)
  sizes = layer_types.stack_sizes(c)
  stacks = {
      s: {
          'w': jnp.arange(n, dtype=jnp.float32) * 10 + i
      } for i, (s, n) in enumerate(sizes.items())
  }
  extra = {'attn': jnp.arange(sizes.get('attn', 0), dtype=jnp.float32) * 1000}

  def fn(kind, carry, layer, rows):
    params, more = layer
    carry = carry * 2 + sum(params[s]['w'] for s in kind.stacks)
    out = {kind.mixer_stack: carry + rows[kind.mixer_stack]}
    if 'attn' in more:
      out['attn'] = out['attn'] + more['attn']
    return carry, out

  want_carry, want = 0.0, {}
  for i, (kind, rows) in enumerate(zip(layer_types.kinds(c), layer_types.rows(c))):
    want_carry = want_carry * 2 + sum(float(stacks[s]['w'][rows[s]]) for s in kind.stacks)
    value = want_carry + rows[kind.mixer_stack]
    if kind.mixer_stack == 'attn':
      value += float(extra['attn'][rows['attn']])
    want.setdefault(kind.mixer_stack, []).append(value)
  carry, out = jax.jit(lambda st, ex: layer_types.scan_layers(fn, jnp.float32(0), (st, ex), c))(
      stacks, extra)
  assert float(carry) == want_carry
  assert {s: list(np.asarray(v)) for s, v in out.items()} == want
  split = layer_types.split_stacks(stacks)
  carry, out = layer_types.loop_layers(fn, jnp.float32(0), (split, layer_types.split_stacks(extra)),
                                       c)
  assert float(carry) == want_carry
  assert {s: [float(x) for x in v] for s, v in out.items()} == want


def test_layer_params_picks_each_stack_row():
  c = _config((L, F, L))
  params = model_lib.init_params(c, jax.random.key(0))
  layer = layer_types.layer_params(params['layers'], c, 2)
  assert set(layer) == {'attn_norm', 'linear_attn', 'mlp_norm', 'mlp'}
  np.testing.assert_array_equal(layer['linear_attn']['q']['kernel'],
                                params['layers']['linear_attn']['q']['kernel'][1])
  np.testing.assert_array_equal(layer['mlp']['up']['kernel'],
                                params['layers']['mlp']['up']['kernel'][2])


def _num_equations(fn, *args):
  return len(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def test_hybrid_program_size_does_not_grow_with_depth():
  """One super-block (3 linear + 1 full) scanned: 2 or 4 repeats trace the same program."""
  sizes = []
  for repeats in (2, 4):
    c = ModelConfig.tiny_hybrid(n_layers=4 * repeats, d_model=32, head_dim=8, d_ff=48,
                                linear_k_head_dim=8, linear_v_head_dim=8,
                                layer_types=(L, L, L, F) * repeats)
    params = jax.eval_shape(lambda c=c: model_lib.init_params(c, jax.random.key(0)))
    tokens = jnp.zeros((1, 8), jnp.int32)
    forward = lambda p, c=c: model_lib.forward(p, c, tokens, tokens, tokens + 1).logits_BLV
    sizes.append(_num_equations(forward, params))
  assert sizes[0] == sizes[1]


@pytest.mark.parametrize('mixers, barriers', [((L, L, L, F) * 2, 4), ((F,) * 3, 0)])
def test_remat_orders_each_recompute_after_its_cotangent_in_multi_layer_steps(mixers, barriers):
  """With remat, a scan step of several layers (a hybrid's pattern) recomputes each layer behind
  an optimisation barrier with its cotangent, one per layer of the step; a one-layer step has
  none. The gradients equal those without remat (the barrier orders, it does not compute)."""
  c = _config(mixers)
  stacks = {
      s: {
          'w': 0.3 + 0.1 * jnp.arange(n * 9.0).reshape(n, 3, 3) / n
      } for s, n in layer_types.stack_sizes(c).items()
  }

  def fn(kind, carry_B3, layer, rows):
    del rows
    return jnp.tanh(carry_B3 @ layer[0][kind.mixer_stack]['w']), {}

  def loss(st, remat):
    carry_B3, _ = layer_types.scan_layers(fn, jnp.ones((2, 3)), (st,), c, remat=remat)
    return jnp.sum(carry_B3**2)

  hlo = jax.jit(jax.grad(lambda st: loss(st, True))).lower(stacks).as_text()
  assert hlo.count('stablehlo.optimization_barrier') == barriers
  got, want = jax.grad(loss)(stacks, True), jax.grad(loss)(stacks, False)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7), got, want)
