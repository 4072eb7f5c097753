"""The planner on a deviceless v5e:2x2 (libtpu): resident bytes, fit verdicts, FLOPs."""
import importlib.util
import os

import jax
import pytest

from jtc.models import model as model_lib
from jtc.rl import cli

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None, reason='libtpu (the plan extra) is not installed')


def _config(path='configs/real/qwen3_0_6b_gsm8k_dfpo.py', model=None, **overrides):
  """A real config with 2 layers (and the ``model`` ModelConfig overrides)."""
  from jtc.plan import suggest  # pylint: disable=import-outside-toplevel
  c = cli._load(os.path.join(cli.REPO, path))  # pylint: disable=protected-access
  c = suggest.apply(c, overrides)
  with c.policy.overrides.ignore_type():
    for k, v in {'n_layers': 2, **(model or {})}.items():
      c.policy.overrides[k] = v
  return c


def _setup(c):
  from jtc.plan import hardware, stages  # pylint: disable=import-outside-toplevel
  return stages.setup(c, hardware.topology_devices('v5e:2x2'), 'tpu')


def _n_params(s):
  return model_lib.num_params(
      jax.eval_shape(lambda: model_lib.init_params(s.model_config, jax.random.key(0))))


def test_param_bytes_per_chip_are_the_analytic_count_over_fsdp():
  s = _setup(_config(**{'mesh.data': 1, 'mesh.fsdp': 4}))
  analytic = _n_params(s) * 4  # float32 master weights
  # Every sharded dimension divides by 4 except the small norms (replicated).
  assert s.params_bytes == pytest.approx(analytic / 4, rel=1e-3)
  # Known positive: without fsdp every chip holds all of them.
  s1 = _setup(_config(**{'mesh.data': -1, 'mesh.fsdp': 1}))
  assert s1.params_bytes == pytest.approx(4 * s.params_bytes, rel=1e-3)
  assert s1.opt_bytes == pytest.approx(2 * s1.params_bytes, rel=1e-3)  # AdamW: mu, nu


def test_population_resident_bytes_are_member_proportional():
  one = _setup(_config())
  four = _setup(_config(**{'population.size': 4}))
  assert four.params_bytes == pytest.approx(4 * one.params_bytes, rel=1e-6)
  assert four.opt_bytes == pytest.approx(4 * one.opt_bytes, rel=1e-6)


def test_update_flops_are_trip_count_corrected():
  """Update FLOPs against a closed form: 6 N_trunk per token of the L-token rows, 8 D V per
  completion token (the LM head's vocabulary scan recomputes its logits in the backward).
  Negative control: every loop body counted once (as XLA's cost_analysis does) falls far short."""
  from jtc.plan import hardware, hlo, stages  # pylint: disable=import-outside-toplevel
  # A narrow model (compiles in seconds) whose vocabulary takes two chunks of the LM head's scan.
  small = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=16_384)
  c = _config(
      model=small, **{
          'policy.remat': False,
          'optim.microbatch_prompts': 2,
          'optim.minibatch_prompts': 4,
          'rollout.prompts_per_step': 4,
          'rollout.sampling.num_samples': 4,
          'data.prompt_width': 16,
          'rollout.sampling.max_new_tokens': 112,
          'mesh.data': 1,
          'mesh.fsdp': 4
      })
  devices = hardware.topology_devices('v5e:2x2')
  s, all_stages = stages.build(c, devices, 'tpu')
  update = [st for st in all_stages if st.name == 'update'][0]
  # The FLOPs come from the lowered program (the planner reads them there), so nothing compiles.
  text = update.fn.trace(*update.args).lower().as_text(dialect='hlo')
  flops = hlo.program_costs(text).flops / len(devices)
  m = s.model_config
  rows, L, T = 4 * 4, 16 + 112, 112
  head = m.d_model * m.vocab_size
  trunk = _n_params(s) - head  # tied embeddings: the head is the embedding
  want = (6 * trunk * rows * L + 8 * head * rows * T) / len(devices)
  assert 0.97 < flops / want < 1.10
  # Known negative: each loop body counted once (XLA's `cost_analysis()` convention).
  assert hlo.program_costs(text, trip_counts=False).flops / len(devices) < 0.6 * want


def test_8b_without_fsdp_does_not_fit_naming_the_update():
  from jtc.plan import hardware, planner  # pylint: disable=import-outside-toplevel
  c = _config('configs/real/qwen3_8b_math_dapo.py', **{
      'mesh.data': -1,
      'mesh.fsdp': 1,
      'optim.microbatch_prompts': 1
  })
  devices = hardware.topology_devices('v5e:2x2')
  p = planner.plan(c, devices, platform='tpu', chip=hardware.CHIPS['v5e'], target='v5e:2x2',
                   compiled_for='test', only=('update',))
  assert not p.fits
  assert "does not fit: stage 'update'" in p.verdict()


def test_bad_topology_and_mesh_are_named():
  from jtc.plan import hardware  # pylint: disable=import-outside-toplevel
  from jtc.rl import sharding  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="unknown topology 'v9z:2x2'.*v5e:2x2"):
    hardware.topology_name('v9z:2x2')
  with pytest.raises(ValueError, match='does not multiply to the 4 devices'):
    sharding.mesh_sizes(data=2, fsdp=1, tensor=1, n_devices=4)
