"""The model tests' configurations, random parameters and padded batches."""
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import model as model_lib
from jtc.models.model_config import ModelConfig

CONFIGS = {
    'gqa_tied':
        ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8,
                         d_ff=48),
    'qwen3_like_untied':
        ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=4, n_kv_heads=1, head_dim=8,
                         d_ff=48, qk_norm=True, tie_embeddings=False, rope_theta=1e6),
    'qwen2_like_bias_mha':
        ModelConfig.tiny(vocab_size=37, n_layers=2, d_model=32, n_heads=2, n_kv_heads=2,
                         head_dim=16, d_ff=48, attn_bias=True, norm_eps=1e-5),
    # Frequencies in all three llama3 regimes: wavelengths 6.3 .. 19,869 vs thresholds 8, 32.
    'llama3_rope':
        ModelConfig.tiny(vocab_size=37, n_layers=3, d_model=32, n_heads=2, n_kv_heads=1,
                         head_dim=16, d_ff=48, rope_scaling='llama3', rope_factor=8.0,
                         rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                         rope_original_max_len=32),
    'linear_rope':
        ModelConfig.tiny(vocab_size=37, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8,
                         d_ff=48, rope_scaling='linear', rope_factor=2.5),
}


def random_params(config, seed=0):
  """Random values (biases and norm scales too) in the layout of `init_params`.

  Filled layer by layer with numpy from `jax.eval_shape` (tracing only, nothing compiled)."""
  shapes = jax.eval_shape(lambda: model_lib.unstack_layers(
      model_lib.init_params(config, jax.random.key(0))))  # per layer: fan-ins by position
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name, shape = path[-1].key, leaf.shape
    if name == 'scale':
      value = 1.0 + 0.3 * rng.standard_normal(shape)
    elif name == 'bias':
      value = 0.3 * rng.standard_normal(shape)
    else:
      fan_in = {
          'embedding': shape[-1]
      }.get(name,
            int(np.prod(shape[:-1])) if path[-2].key == 'o' else shape[0])
      value = rng.standard_normal(shape) / np.sqrt(fan_in)
    return jnp.asarray(value, leaf.dtype)

  return model_lib.stack_layers(jax.tree_util.tree_map_with_path(fill, shapes))


def padded_batch(rows, width, pad=0):
  tokens = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    tokens[b, width - len(row):] = row
    mask[b, width - len(row):] = 1
  return jnp.asarray(tokens), jnp.asarray(mask)


ROWS = [[3, 9, 14, 2, 30, 7], [5, 1, 22], [11, 36, 0, 4, 8, 19, 25]]
