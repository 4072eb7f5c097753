"""Tests of jtc.models.layers: RoPE's llama3 frequency scaling as Llama 3.2 defines it."""
import dataclasses

import numpy as np

from jtc.models import layers
from jtc.models.model_config import ModelConfig


def test_llama3_rope_of_llama_3_2_rescales_17_of_32_frequencies():
  """Llama-3.2 (head_dim 64, theta 5e5, factor 32, thresholds 8192/4 and 8192/1): frequency j
  is kept iff its wavelength 2 pi theta^(2j/64) < 2048, i.e. j <= 14; the other 17 change."""
  config = ModelConfig.llama3_1b()
  plain = layers.rope_inv_freq(dataclasses.replace(config, rope_scaling='default'))
  scaled = layers.rope_inv_freq(config)
  changed = np.flatnonzero(~np.isclose(scaled, plain, rtol=1e-6))
  np.testing.assert_array_equal(changed, np.arange(15, 32))
  wavelengths = 2 * np.pi / np.asarray(plain, np.float64)
  low = wavelengths > 8192  # divided by the factor outright
  np.testing.assert_allclose(np.asarray(scaled)[low], np.asarray(plain)[low] / 32, rtol=1e-6)
  np.testing.assert_allclose(
      layers.rope_inv_freq(dataclasses.replace(config, rope_scaling='linear', rope_factor=4.0)),
      plain / 4, rtol=1e-6)
