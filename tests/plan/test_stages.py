"""The planner's stages on a deviceless v5e:2x2 (libtpu): the state each chip keeps resident."""
import pytest

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


def test_a_lora_config_is_refused_not_planned_as_full_fine_tuning():
  with pytest.raises(ValueError, match='config.lora.rank=4: jtc.plan models full fine-tuning'):
    real_configs.setup(real_configs.config(**{'lora.rank': 4}))
