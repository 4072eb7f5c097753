"""`jtc plan`: a bad target is an error naming the valid ones, before anything compiles; a mesh
that cannot run on the target stops a plan but not a --suggest search."""
import pytest

from jtc.cli import plan
from jtc.plan import hardware
from jtc.plan import planner
from jtc.plan import suggest


def test_an_unknown_topology_is_named_with_the_known_ones():
  with pytest.raises(SystemExit) as stop:
    plan.main(['--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py', '--topology', 'v9z:2x2'])
  assert "unknown topology 'v9z:2x2'" in str(stop.value.code) and 'v5e:2x2' in str(stop.value.code)


def test_a_target_is_required():
  with pytest.raises(SystemExit) as stop:
    plan.main(['--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'])
  assert '--topology (or --gpu) is required' in str(stop.value.code)


@pytest.mark.parametrize('flags, searched', [([], False), (['--suggest'], True)])
def test_a_mesh_that_cannot_run_stops_a_plan_but_not_a_search(monkeypatch, flags, searched):
  calls = []
  monkeypatch.setattr(plan, 'target', lambda *a: ([object()] * 64, 'tpu', None, 'v5e-64', 'test'))
  monkeypatch.setattr(suggest, 'suggest', lambda *a, **k: calls.append(a) or (None, None))
  monkeypatch.setattr(planner, 'model_config_for', lambda *a: None)
  with pytest.raises(SystemExit) as stop:  # 32 sequences a micro-batch do not split 64 ways
    plan.main(['--config', 'configs/real/qwen3_8b_math_dapo.py', '--topology', 'v5e-64', *flags])
  assert bool(calls) == searched
  said = str(stop.value.code)
  assert ('no candidate setting fits' in said) if searched else ('does not split over' in said)


@pytest.mark.parametrize('argv, want', [(['--gpu', 'h100', '--gpus', '1'], '1'),
                                        (['--gpu=h100', '--gpus=2'], '2'), (['--gpu', 'h100'], '8'),
                                        (['--gpus', '4', '--gpus=16'], '16')])
def test_the_gpu_count_is_read_in_either_flag_form(argv, want):
  """--gpus N and --gpus=N both set the host device count (absl accepts both; the last wins)."""
  assert plan.gpus_flag(argv) == want


def test_gpu_target_is_labelled_an_estimate_and_checks_the_host_devices():
  """`--gpu`: JAX cannot compile for CUDA without a GPU, so the plan compiles for host devices
  with the GPU's constants and says so; a device count the host was not given is an error."""
  devices, platform, chip, where, compiled_for = plan.target('h100', 1, None, 1)
  assert (len(devices), platform, chip) == (1, 'gpu', hardware.CHIPS['h100'])
  assert 'estimate, not compiled for the GPU' in compiled_for and 'h100' in where
  with pytest.raises(ValueError, match='--gpus=8: 1 host devices'):
    plan.target('h100', 8, None, 1)


def test_an_unknown_stage_is_named_with_the_valid_ones_before_anything_compiles(monkeypatch):
  monkeypatch.setattr(plan, 'target', lambda *a: pytest.fail('the target was built'))
  with pytest.raises(SystemExit) as stop:
    plan.main([
        '--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py', '--topology', 'v5e-8', '--stages=updte'
    ])
  said = str(stop.value.code)
  assert "unknown stage 'updte'" in said and 'valid: prefill, sample, behaviour' in said


def test_a_stage_the_config_does_not_run_is_named_with_its_stages():
  """--stages=delta on a config without DelTA: an error listing the config's own stages, and
  nothing compiled (one host device stands in for one GPU)."""
  with pytest.raises(SystemExit) as stop:
    plan.main([
        '--config', 'configs/real/qwen3_0_6b_gsm8k_dfpo.py', '--gpu', 'h100', '--gpus', '1',
        '--stages=delta'
    ])
  said = str(stop.value.code)
  assert "this config runs no 'delta' stage; its stages: prefill, sample, behaviour" in said
