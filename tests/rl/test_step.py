"""The RL step built once (`jtc.rl.step`): the state each chip holds, read from the abstract
step on meshes without devices; the trainer's placed state is the abstract one; jtc/rl never
imports the planner above it."""
import ast
import glob
import os

import jax
import pytest

from configs import common
from jtc.cli import absl_program
from jtc.models import lora
from jtc.models import model as model_lib
from jtc.plan import suggest
from jtc.rl import sharding
from jtc.rl import step as step_lib

REPO = absl_program.REPO


def _config(**overrides):
  """The 0.6B real config with 2 layers."""
  c = absl_program.load_config(os.path.join(REPO, 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'))
  c = suggest.apply(c, overrides)
  with c.policy.overrides.ignore_type():
    c.policy.overrides.n_layers = 2
  return c


def _step(c, **sizes):
  """The abstract step of ``c`` on a mesh of ``sizes`` (population, data, fsdp, tensor)."""
  mesh = jax.sharding.AbstractMesh(tuple(sizes.get(a, 1) for a in sharding.MESH_AXES),
                                   sharding.MESH_AXES)
  from jtc.plan import planner  # pylint: disable=import-outside-toplevel
  return step_lib.build(c, mesh, planner.model_config_for(c, 'tpu'))


def _n_params(step):
  return model_lib.num_params(
      jax.eval_shape(lambda: model_lib.init_params(step.model_config, jax.random.key(0))))


def _adapter_params(m, rank, layers=2):
  """r x (fan_in + fan_out) per adapted projection and layer, all seven targets (Hu et al.)."""
  D, N, K, H, F = m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff
  fans = [(D, N * H), (D, K * H), (D, K * H), (N * H, D), (D, F), (D, F), (F, D)]
  return layers * sum(rank * (i + o) for i, o in fans)


def test_no_module_of_jtc_rl_imports_the_planner():
  """The trainer's package sits below `jtc.plan`: the planner reads the step, never the other
  way round (imports inside functions included)."""
  offenders = []
  for path in glob.glob(os.path.join(REPO, 'jtc', 'rl', '**', '*.py'), recursive=True):
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      names = ([a.name for a in node.names]
               if isinstance(node, ast.Import) else [f'{node.module}.{a.name}' for a in node.names]
               if isinstance(node, ast.ImportFrom) and node.module else [])
      offenders += [
          f'{os.path.relpath(path, REPO)}: {n}' for n in names if n.startswith('jtc.plan')
      ]
  assert not offenders
  # Known positive for the scan: the planner's modules do import jtc.rl.
  with open(os.path.join(REPO, 'jtc', 'plan', 'planner.py')) as f:
    assert 'from jtc.rl import step' in f.read()


def test_param_bytes_per_chip_are_the_analytic_count_over_fsdp():
  s = _step(_config(), fsdp=4)
  parts = s.resident_parts()
  assert parts['params'] == pytest.approx(_n_params(s) * 4 / 4, rel=1e-3)  # float32, over 4
  one = _step(_config(), data=4).resident_parts()  # known positive: without fsdp, all of them
  assert one['params'] == pytest.approx(4 * parts['params'], rel=1e-3)
  assert one['opt_state'] == pytest.approx(2 * one['params'], rel=1e-3)  # AdamW: mu, nu


def test_population_resident_bytes_are_member_proportional():
  one = _step(_config(), fsdp=4).resident_parts()
  four = _step(_config(**{'population.size': 4}), fsdp=4).resident_parts()
  assert four['params'] == pytest.approx(4 * one['params'], rel=1e-6)
  assert four['opt_state'] == pytest.approx(4 * one['opt_state'], rel=1e-6)


def test_the_kl_reference_is_a_copy_in_its_dtype_or_under_lora_the_base():
  """kl_coef > 0 keeps a frozen copy (bfloat16 here: half the float32 params); a member's own
  kl_coef counts; under LoRA the reference is the base itself (no bytes); kl_coef 0: none."""
  bf16 = _step(_config(**{'loss.hparams.kl_coef': 0.01, 'policy.ref_param_dtype': 'bfloat16'}))
  assert bf16.reference == 'copy'
  assert bf16.resident_parts()['reference'] == pytest.approx(bf16.resident_parts()['params'] / 2,
                                                             rel=1e-6)
  varied = _step(
      _config(**{
          'population.size': 1,
          'population.vary': 'loss.hparams.kl_coef=0.0,0.01'
      }))
  assert varied.reference == 'copy' and varied.ref is not None
  lora_kl = _step(_config(**{'loss.hparams.kl_coef': 0.01, 'lora.rank': 4}))
  assert lora_kl.ref is lora_kl.frozen and lora_kl.resident_parts()['reference'] == 0
  none = _step(_config())
  assert none.reference == '' and none.ref is None


def test_lora_resident_bytes_are_the_base_over_fsdp_plus_adapters_and_adamw():
  """Rank 4 on fsdp = 4: the frozen base is sharded like full parameters, the adapters
  (float32, unsharded) and their AdamW moments are whole on every chip."""
  s = _step(_config(**{'lora.rank': 4}), fsdp=4)
  parts = s.resident_parts()
  assert parts['base'] == pytest.approx(_n_params(s) * 4 / 4, rel=1e-3)
  adapters = _adapter_params(s.model_config, 4) * 4
  assert parts['params'] == adapters
  assert parts['opt_state'] == pytest.approx(2 * adapters, rel=1e-4)  # + AdamW's step counts
  assert s.resident() == pytest.approx(parts['base'] + 3 * adapters, rel=1e-4)


def test_lora_population_grows_by_the_adapters_and_the_base_is_replicated_over_members():
  """4 LoRA members hold 3 more copies of the adapters and their AdamW state than 1 and the
  same base; with mesh.population = 2 and fsdp = 2 a chip holds half the base and 2 members'
  adapters. Known positive: 4 full-parameter members grow member-proportionally."""
  one = _step(_config(**{'lora.rank': 4}), fsdp=4)
  four = _step(_config(**{'lora.rank': 4, 'population.size': 4}), fsdp=4)
  trained = one.resident_parts()['params'] + one.resident_parts()['opt_state']
  assert four.resident_parts()['base'] == one.resident_parts()['base']
  assert four.resident() - one.resident() == pytest.approx(3 * trained, rel=1e-3)
  full_1, full_4 = _step(_config(), fsdp=4), _step(_config(**{'population.size': 4}), fsdp=4)
  assert full_4.resident() == pytest.approx(4 * full_1.resident(), rel=1e-3)
  split = _step(_config(**{
      'lora.rank': 4,
      'population.size': 4,
      'mesh.population': 2
  }), population=2, fsdp=2)
  assert split.resident_parts()['base'] == pytest.approx(_n_params(split) * 4 / 2, rel=1e-3)
  assert split.resident_parts()['params'] == 2 * _adapter_params(split.model_config, 4) * 4


def test_rank_0_is_full_fine_tuning_whatever_the_other_lora_keys():
  s, other = _step(_config()), _step(_config(**{'lora.alpha': 2.0, 'lora.targets': 'q'}))
  assert s.frozen is None and s.policy(s.state.params) is s.state.params
  assert s.resident_parts() == other.resident_parts()
  with pytest.raises(ValueError, match='config.lora.rank=100000 exceeds target'):
    _step(_config(**{'lora.rank': 100000}))


def test_the_materialised_state_is_the_abstract_one():
  """What the trainer places (`Step.materialise`: a 2-member LoRA population with a KL term)
  has the abstract state's shapes, dtypes and shardings, leaf for leaf, the base placed as the
  abstract base and the reference the base itself."""
  c = suggest.apply(common.get_config('smoke'), {
      'lora.rank': 4,
      'loss.hparams.kl_coef': 0.01,
      'population.size': 2
  })
  m = model_lib.ModelConfig.tiny()
  params = jax.device_get(model_lib.init_params(m, jax.random.key(0)))
  step = step_lib.build(c, sharding.make_mesh(), m, params=params)
  state, frozen, reference = step.materialise(params)
  placed = lambda t: jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), t)
  assert placed(state) == placed(step.state)
  assert placed(frozen) == placed(step.frozen) and reference is frozen
  assert isinstance(step.policy(state.params), lora.Adapted)
