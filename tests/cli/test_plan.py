"""`jtc plan`: a bad target is an error naming the valid ones, before anything compiles."""
import pytest

from jtc.cli import plan


def test_an_unknown_topology_is_named_with_the_known_ones():
  with pytest.raises(SystemExit) as stop:
    plan.main(['--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py', '--topology', 'v9z:2x2'])
  assert "unknown topology 'v9z:2x2'" in str(stop.value.code) and 'v5e:2x2' in str(stop.value.code)


def test_a_target_is_required():
  with pytest.raises(SystemExit) as stop:
    plan.main(['--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'])
  assert '--topology (or --gpu) is required' in str(stop.value.code)
