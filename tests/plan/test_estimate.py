"""The analytic estimate `--suggest` filters with: its state bytes against the planner's exact
per-chip shards, its KV cache against the sampler's own cache shapes, and the filter's verdicts
at both ends (a 32B state that no v5e-8 holds; a 0.6B that fits)."""
import importlib.util
import os

import jax
import pytest

from jtc.models import decode
from jtc.models import model as model_lib
from jtc.plan import estimate
from jtc.plan import hardware
from jtc.plan import stages
from jtc.plan import suggest
from jtc.cli import absl_program
from jtc.rl import sharding

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None, reason='libtpu (the plan extra) is not installed')


def _config(path='configs/real/qwen3_0_6b_gsm8k_dfpo.py', **overrides):
  return suggest.apply(absl_program.load_config(os.path.join(absl_program.REPO, path)), overrides)


@needs_libtpu
@pytest.mark.parametrize('mesh', [(1, 1, 4, 1), (1, 4, 1, 1), (4, 1, 1, 1), (2, 1, 1, 2)])
def test_state_bytes_equal_the_planners_shards(mesh):
  """(population, data, fsdp, tensor) on v5e:2x2, 4 members when population > 1, a KL
  reference in bfloat16: the estimate's bytes are the abstract state's shards, leaf by leaf."""
  population, data, fsdp, tensor = mesh
  c = _config(
      **{
          'mesh.population': population,
          'mesh.data': data,
          'mesh.fsdp': fsdp,
          'mesh.tensor': tensor,
          'population.size': 4 if population > 1 else 1,
          'loss.hparams.kl_coef': 0.01,
          'policy.ref_param_dtype': 'bfloat16'
      })
  with c.policy.overrides.ignore_type():
    c.policy.overrides.n_layers = 2
  s = stages.setup(c, hardware.topology_devices('v5e:2x2'), 'tpu')
  got = estimate.state_bytes(c, s.model_config, dict(s.mesh.shape))
  assert got['params'] == pytest.approx(s.params_bytes, rel=1e-9)
  assert got['opt_state'] == pytest.approx(s.opt_bytes, rel=1e-3)  # + AdamW's step counts
  assert got['reference'] == pytest.approx(s.ref_bytes, rel=1e-9)


def test_kv_cache_term_is_the_samplers_cache():
  """The sample stage's cache term equals the bytes of the `GroupCache` the sampler builds
  (traced, not run) over the same shards: 8 prompts x G = 4 over data = 2, tensor = 2."""
  c = _config(**{'rollout.chunk_prompts': 8, 'rollout.sampling.num_samples': 4})
  m = stages.model_config_for(c, 'tpu')
  B, P, T = 8, c.data.prompt_width, c.rollout.sampling.max_new_tokens
  sizes = dict(population=1, data=2, fsdp=1, tensor=2)
  params = jax.eval_shape(lambda: model_lib.init_params(m, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((B, P), 'int32')
  _, cache = jax.eval_shape(
      lambda p, t: decode.prefill(p, m, t, t, num_samples=4, max_new_tokens=T), params, tokens)
  shards = {'batch': 2, 'kv_heads': 2}
  want = sum(x.size * x.dtype.itemsize / shards['batch'] / shards['kv_heads']
             for x in (cache.k_YRKHT, cache.v_YRKTH, cache.prompt_k_YBKPH, cache.prompt_v_YBKPH))
  x = estimate.context(c, m, sizes, hardware.CHIPS['v5e'])
  assert estimate.kv_cache_bytes(x, B, 4, P, T) == pytest.approx(want, rel=1e-9)


def test_the_filter_keeps_what_can_fit_and_drops_what_cannot():
  """Known negative: Qwen3-32B's float32 state (~393 GB) cannot fit v5e-8's 8 x 16 GiB in any
  setting. Known positive: the 0.6B config has settings that fit a v5e-4, cheapest first."""
  v5e = hardware.CHIPS['v5e']
  big = _config('configs/real/qwen3_32b_aime_dfpo.py')
  assert suggest.candidates(big, 8, stages.model_config_for(big, 'tpu'), v5e) == []
  small = _config(**{'rollout.prompts_per_step': 8, 'optim.minibatch_prompts': 8})  # fewer to try
  found = suggest.candidates(small, 4, stages.model_config_for(small, 'tpu'), v5e)
  assert found and all(est.peak <= v5e.hbm_bytes for est, _ in found)
  seconds = [est.seconds for est, _ in found]
  assert seconds == sorted(seconds)
  sizes = sharding.mesh_sizes(data=1, fsdp=4, tensor=1, n_devices=4)
  assert estimate.estimate(small, stages.model_config_for(small, 'tpu'), sizes, v5e).peak > 0


@needs_libtpu
def test_lora_state_bytes_equal_the_planners_shards():
  """A 4-member LoRA population (2 per chip over mesh.population = 2, fsdp = 2) with a KL
  term: the estimate's base, adapters, AdamW and (no) reference are the planner's shards."""
  c = _config(
      **{
          'mesh.population': 2,
          'mesh.data': 1,
          'mesh.fsdp': 2,
          'population.size': 4,
          'lora.rank': 8,
          'lora.targets': 'q,v,down',
          'loss.hparams.kl_coef': 0.01
      })
  with c.policy.overrides.ignore_type():
    c.policy.overrides.n_layers = 2
  s = stages.setup(c, hardware.topology_devices('v5e:2x2'), 'tpu')
  got = estimate.state_bytes(c, s.model_config, dict(s.mesh.shape))
  assert got['base'] == pytest.approx(s.base_bytes, rel=1e-9)
  assert got['params'] == pytest.approx(s.params_bytes, rel=1e-9)
  assert got['opt_state'] == pytest.approx(s.opt_bytes, rel=1e-3)  # + AdamW's step counts
  assert got['reference'] == s.ref_bytes == 0


def test_a_lora_population_estimate_grows_by_the_adapters_not_the_base():
  """The estimate's peak of 4 members over 1: a LoRA population adds far less than a
  full-parameter one (which adds 3 more copies of the parameters and AdamW state)."""
  v5e = hardware.CHIPS['v5e']
  sizes = sharding.mesh_sizes(data=1, fsdp=4, tensor=1, n_devices=4)

  def growth(**overrides):
    peaks = []
    for n in (1, 4):
      c = _config(**{'population.size': n, **overrides})
      peaks.append(estimate.estimate(c, stages.model_config_for(c, 'tpu'), sizes, v5e).peak)
    return peaks[1] - peaks[0]

  c = _config()
  full_state = sum(estimate.state_bytes(c, stages.model_config_for(c, 'tpu'), sizes).values())
  assert growth() > 3 * full_state
  assert growth(**{'lora.rank': 4}) < growth() - 3 * full_state * 0.9
