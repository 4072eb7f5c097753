"""Tests of jtc.models.gated_deltanet: the causal convolution against numpy, the chunked and
recurrent forms of the layer agree (left padding, lengths that are not a multiple of the chunk),
a left-padded row equals the unpadded one, a state carries a sequence across calls, and the
gated norm's closed form."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.models import gated_deltanet
from jtc.models.model_config import ModelConfig

CONFIG = ModelConfig.tiny(d_model=24, linear_n_k_heads=2, linear_n_v_heads=4, linear_k_head_dim=6,
                          linear_v_head_dim=5, linear_conv_width=4, linear_chunk=4)


@pytest.fixture(scope='module')
def layer():
  p = gated_deltanet.init_params(CONFIG, jax.random.key(0))
  # Larger gates than the initialisation, so that decay and write strength both matter.
  return dict(p, dt_bias=jnp.full_like(p['dt_bias'], -1.0),
              norm={'scale': 1 + 0.3 * jax.random.normal(jax.random.key(1), (5,))})


def test_causal_conv_is_numpys_convolution_with_history():
  rng = np.random.default_rng(0)
  x, kernel, history = rng.normal(size=(2, 7, 3)), rng.normal(size=(4, 3)), rng.normal(size=(2, 3,
                                                                                             3))
  y, new_history = gated_deltanet.causal_conv(jnp.asarray(x), jnp.asarray(kernel),
                                              jnp.asarray(history))
  full = np.concatenate([history, x], axis=1)
  # np.convolve flips the kernel: y_t = sum_w kernel[w] x_{t - 3 + w}.
  pre = np.stack([
      np.stack([np.convolve(full[b, :, c], kernel[::-1, c], 'valid')
                for c in range(3)], -1)
      for b in range(2)
  ])
  np.testing.assert_allclose(y, pre / (1 + np.exp(-pre)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_history, full[:, -3:], rtol=1e-6)


def _inputs(L, pads):
  h = jax.random.normal(jax.random.key(2), (len(pads), L, CONFIG.d_model))
  mask = (jnp.arange(L)[None] >= jnp.asarray(pads)[:, None]).astype(jnp.int32)
  return h, mask


@pytest.mark.parametrize('L', [8, 11])
def test_chunked_and_recurrent_forms_agree_with_left_padding(layer, L):
  h, mask = _inputs(L, pads=[0, 3])
  mix = jax.jit(lambda form: gated_deltanet.mix(layer, h, mask, CONFIG, form=form),
                static_argnums=0)
  (out_c, state_c), (out_r, state_r) = mix('chunked'), mix('recurrent')
  np.testing.assert_allclose(out_c, out_r, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), state_c,
               state_r)


def test_a_left_padded_row_equals_the_unpadded_row(layer):
  h, mask = _inputs(9, pads=[0, 4])
  padded, padded_state = gated_deltanet.mix(layer, h, mask, CONFIG)
  alone, alone_state = gated_deltanet.mix(layer, h[1:, 4:], mask[1:, 4:], CONFIG)
  np.testing.assert_allclose(padded[1, 4:], alone[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(padded_state.ssm_BNHH[1], alone_state.ssm_BNHH[0], rtol=1e-5,
                             atol=1e-6)


@pytest.mark.slow
def test_a_state_carries_the_sequence_token_by_token(layer):
  """Prefill 6 tokens, then one recurrent step per token: the outputs of one chunked pass."""
  h, mask = _inputs(10, pads=[0, 2])
  whole, _ = gated_deltanet.mix(layer, h, mask, CONFIG)
  out, state = gated_deltanet.mix(layer, h[:, :6], mask[:, :6], CONFIG)
  steps = [out]
  for t in range(6, 10):
    out, state = gated_deltanet.mix(layer, h[:, t:t + 1], mask[:, t:t + 1], CONFIG, state,
                                    form='recurrent')
    steps.append(out)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), whole, rtol=1e-5, atol=1e-5)


def test_the_chunk_length_is_a_speed_knob_only(layer):
  h, mask = _inputs(11, pads=[0, 1])
  a, _ = gated_deltanet.mix(layer, h, mask, CONFIG)
  b, _ = gated_deltanet.mix(layer, h, mask, dataclasses.replace(CONFIG, linear_chunk=3))
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('form', ['chunked', 'recurrent'])
def test_bf16_compute_carries_a_float32_delta_rule_state(layer, form):
  """With compute dtype bfloat16 the layer's output and convolution history are bf16 and the
  delta rule's state float32, in both forms (abstract shapes: `jax.eval_shape`; the values'
  closeness to a float32 run: tests/models/test_delta_rule.py)."""
  config = dataclasses.replace(CONFIG, dtype='bfloat16')
  h, mask = _inputs(5, pads=[0, 2])
  out, state = jax.eval_shape(lambda h: gated_deltanet.mix(layer, h, mask, config, form=form),
                              h.astype(jnp.bfloat16))
  assert out.dtype == state.conv_q.dtype == state.conv_v.dtype == jnp.bfloat16
  assert state.ssm_BNHH.dtype == jnp.float32


def test_gated_rms_norm_closed_form():
  o = np.array([[3.0, 4.0]])
  z = np.array([[0.0, 2.0]])
  got = gated_deltanet.gated_rms_norm(o, z, np.array([1.0, 2.0]), 0.0, jnp.float32)
  rms = np.sqrt(12.5)
  np.testing.assert_allclose(got, [[3 / rms * 0.0, 4 / rms * 2 * 2 / (1 + np.exp(-2))]], rtol=1e-6)


def test_an_unknown_form_is_named(layer):
  h, mask = _inputs(4, pads=[0])
  with pytest.raises(ValueError, match="form='parallel'"):
    gated_deltanet.mix(layer, h, mask, CONFIG, form='parallel')


def test_the_tensor_axis_must_divide_the_heads(layer):
  gated_deltanet.check_tensor_axis(layer, 2)  # 2 key / 4 value heads: fine
  with pytest.raises(ValueError,
                     match=r'config.mesh.tensor=4 does not divide .*linear_n_k_heads=2'):
    gated_deltanet.check_tensor_axis(layer, 4)
