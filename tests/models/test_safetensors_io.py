"""The safetensors reader of jtc.models.safetensors_io against the safetensors library."""
import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

from jtc.models import safetensors_io


def test_safetensors_reader_matches_the_safetensors_library(tmp_path):
  rng = np.random.default_rng(3)
  tensors = {
      'a': rng.normal(size=(3, 5)).astype(np.float32),
      'b': rng.normal(size=(7,)).astype(np.float16),
      'c': rng.normal(size=(2, 2, 3)).astype(ml_dtypes.bfloat16),
      'empty': np.zeros((0, 4), np.float32)
  }
  save_file(tensors, str(tmp_path / 'x.safetensors'))
  reference = load_file(str(tmp_path / 'x.safetensors'))
  entries = safetensors_io.read_safetensors_header(tmp_path / 'x.safetensors')
  assert set(entries) == set(tensors)
  for key, entry in entries.items():
    got = safetensors_io.read_tensor(entry, key)
    assert got.dtype == reference[key].dtype and got.shape == reference[key].shape
    np.testing.assert_array_equal(got, reference[key])
