"""The planner's stages on a deviceless v5e:2x2 (libtpu): the state each chip keeps resident."""
import pytest

from jtc.models import lora
from jtc.plan import hardware
from jtc.plan import stages
from tests.plan import real_configs

pytestmark = real_configs.needs_libtpu


def test_param_bytes_per_chip_are_the_analytic_count_over_fsdp():
  s = real_configs.setup(real_configs.config(**{'mesh.data': 1, 'mesh.fsdp': 4}))
  analytic = real_configs.n_params(s) * 4  # float32 master weights
  # Every sharded dimension divides by 4 except the small norms (replicated).
  assert s.params_bytes == pytest.approx(analytic / 4, rel=1e-3)
  # Known positive: without fsdp every chip holds all of them.
  s1 = real_configs.setup(real_configs.config(**{'mesh.data': -1, 'mesh.fsdp': 1}))
  assert s1.params_bytes == pytest.approx(4 * s.params_bytes, rel=1e-3)
  assert s1.opt_bytes == pytest.approx(2 * s1.params_bytes, rel=1e-3)  # AdamW: mu, nu


def test_population_resident_bytes_are_member_proportional():
  one = real_configs.setup(real_configs.config())
  four = real_configs.setup(real_configs.config(**{'population.size': 4}))
  assert four.params_bytes == pytest.approx(4 * one.params_bytes, rel=1e-6)
  assert four.opt_bytes == pytest.approx(4 * one.opt_bytes, rel=1e-6)


def _adapter_params(m, rank, layers=2):
  """r x (fan_in + fan_out) per adapted projection and layer, all seven targets (Hu et al.)."""
  D, N, K, H, F = m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff
  fans = [(D, N * H), (D, K * H), (D, K * H), (N * H, D), (D, F), (D, F), (F, D)]
  return layers * sum(rank * (i + o) for i, o in fans)


def test_lora_resident_bytes_are_the_base_over_fsdp_plus_adapters_and_adamw():
  """Rank 4 on fsdp = 4 with a KL term: the frozen base is sharded like full parameters, the
  adapters (float32, unsharded) and their AdamW moments are whole on every chip, and the
  reference is the base itself (no copy)."""
  s = real_configs.setup(
      real_configs.config(**{
          'mesh.data': 1,
          'mesh.fsdp': 4,
          'lora.rank': 4,
          'loss.hparams.kl_coef': 0.01
      }))
  assert s.base_bytes == pytest.approx(real_configs.n_params(s) * 4 / 4, rel=1e-3)
  adapters = _adapter_params(s.model_config, 4) * 4
  assert s.params_bytes == adapters
  assert s.opt_bytes == pytest.approx(2 * adapters, rel=1e-4)  # AdamW: mu, nu (+ step counts)
  assert s.ref_params is s.frozen and s.ref_bytes == 0
  assert s.resident() == pytest.approx(s.base_bytes + 3 * adapters, rel=1e-4)
  # Every pass reads the adapters on the base; the update takes the base as its fourth argument.
  _, built = stages.build(s.c, hardware.topology_devices('v5e:2x2'), 'tpu')
  by_name = {st.name: st for st in built}
  assert isinstance(by_name['behaviour'].args[0], lora.Adapted)
  assert by_name['reference'].args[0].adapters is None
  assert isinstance(by_name['update'].args[3], lora.Adapted)
  assert by_name['update'].resident_other == 0  # everything resident is among its arguments


def test_lora_population_grows_by_the_adapters_not_the_base():
  """Known positive and negative: 4 LoRA members hold about 3 more copies of the adapters and
  their AdamW state than 1 member, and the same single base; 4 full-parameter members grow
  member-proportionally."""
  lora_1 = real_configs.setup(real_configs.config(**{'lora.rank': 4}))
  lora_4 = real_configs.setup(real_configs.config(**{'lora.rank': 4, 'population.size': 4}))
  trained = lora_1.params_bytes + lora_1.opt_bytes
  assert lora_4.base_bytes == lora_1.base_bytes
  assert lora_4.resident() - lora_1.resident() == pytest.approx(3 * trained, rel=1e-3)
  assert lora_4.resident() - lora_1.resident() < 0.05 * lora_1.base_bytes
  full_1 = real_configs.setup(real_configs.config())
  full_4 = real_configs.setup(real_configs.config(**{'population.size': 4}))
  assert full_4.resident() == pytest.approx(4 * full_1.resident(), rel=1e-3)


def test_lora_base_is_replicated_over_the_population_axis():
  """mesh.population = 2, fsdp = 2: each chip holds half the base (fsdp) whatever its members,
  and the adapters of its 2 members (of 4)."""
  s = real_configs.setup(
      real_configs.config(**{
          'lora.rank': 4,
          'population.size': 4,
          'mesh.population': 2,
          'mesh.data': 1,
          'mesh.fsdp': 2
      }))
  assert s.base_bytes == pytest.approx(real_configs.n_params(s) * 4 / 2, rel=1e-3)
  assert s.params_bytes == 2 * _adapter_params(s.model_config, 4) * 4


def test_rank_0_plans_full_fine_tuning_whatever_the_other_lora_keys():
  """Rank 0 has no frozen base: the passes read the trained parameters, the update takes 3
  arguments, and the state does not depend on lora.alpha or lora.targets."""
  s = real_configs.setup(real_configs.config())
  other = real_configs.setup(real_configs.config(**{'lora.alpha': 2.0, 'lora.targets': 'q'}))
  assert s.frozen is None and s.base_bytes == 0 and s.policy is s.state.params
  assert (s.params_bytes, s.opt_bytes) == (other.params_bytes, other.opt_bytes)
  assert s.params_bytes == pytest.approx(real_configs.n_params(s) * 4 / 4, rel=1e-3)  # fsdp 4
  _, built = stages.build(s.c, hardware.topology_devices('v5e:2x2'), 'tpu')
  assert not any(lora.has_adapted(st.args) for st in built)
  assert len(next(st for st in built if st.name == 'update').args) == 3


def test_a_lora_rank_the_targets_cannot_take_is_refused():
  with pytest.raises(ValueError, match='config.lora.rank=100000 exceeds target'):
    real_configs.setup(real_configs.config(**{'lora.rank': 100000}))
