"""The sampler benchmark's roofline floor (benchmarks/sampler.py): closed forms at its limits."""

import math

import jax
import pytest

from benchmarks import sampler as bench
from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig


def _floor(**kw):
  args = dict(B=4, G=2, P=16, T=32, block_size=8, bandwidth=1e9, peak_flops=1e12)
  return bench.decode_floor_seconds(ModelConfig.tiny(vocab_size=64), 1e6, **{**args, **kw})


def test_matmul_params_are_the_weights_a_token_passes_through():
  c = ModelConfig.tiny(vocab_size=64)
  params = model_lib.init_params(c, jax.random.key(0))
  layer_weights = sum(x.size for x in jax.tree_util.tree_leaves(params['layers']) if x.ndim > 2)
  assert bench.num_matmul_params(c) == layer_weights + c.vocab_size * c.d_model


def test_floor_is_the_bandwidth_term_when_compute_is_free():
  c = ModelConfig.tiny(vocab_size=64)
  R, P, T, C = 8, 16, 32, 8
  slot = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # f32 k and v of one slot
  floor = _floor(peak_flops=math.inf)
  assert floor['old'] == (pytest.approx(T * (1e6 + R * (P + T) * slot) / 1e9), 0.0)
  live = sum(-(-(t + 1) // C) * C for t in range(T))
  assert floor['new'][0] == pytest.approx((T * (1e6 + 4 * P * slot) + R * live * slot) / 1e9)


def test_floor_is_the_flops_term_when_bytes_are_free():
  c = ModelConfig.tiny(vocab_size=64)
  R, P, T = 8, 16, 32
  floor = _floor(bandwidth=math.inf)
  flops = T * (2 * R * bench.num_matmul_params(c) + bench.attention_flops(c, R, 1, P + T))
  assert floor['old'] == (pytest.approx(flops / 1e12), 1.0)
  assert floor['new'][1] == 1.0 and floor['new'][0] < floor['old'][0]


def test_roofline_is_at_least_each_bound_and_at_most_their_sum():
  both, mem, comp = _floor(), _floor(peak_flops=math.inf), _floor(bandwidth=math.inf)
  for d in ('old', 'new'):
    assert max(mem[d][0], comp[d][0]) <= both[d][0] <= mem[d][0] + comp[d][0] * (1 + 1e-12)
