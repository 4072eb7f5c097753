"""The trainer's preflight (issue 43, item 6) on the CPU with a stated capacity: each stage is
compiled once (the preflight compiles the functions the steps call), and a capacity too small
stops the run with `does not fit`, naming the stage."""
import logging
import re

import jax
import pytest

from configs import gspo
from jtc.plan import hardware
from jtc.plan import preflight
from jtc.rl import trainer as trainer_lib

FUNCTIONS = ('_sample_impl', 'behaviour_pass', 'update_step')


class _Compiles(logging.Handler):
  """Counts jax's 'Compiling jit(<name>)' log lines (jax_log_compiles) per function name."""

  def __init__(self):
    super().__init__()
    self.names = []

  def emit(self, record):
    m = re.match(r'Compiling jit\((\w+)\)', record.getMessage())
    if m:
      self.names.append(m.group(1))

  def count(self, name):
    return self.names.count(name)


@pytest.fixture
def compiles():
  handler = _Compiles()
  logger = logging.getLogger('jax')
  level = logger.level
  logger.setLevel(logging.DEBUG)  # whatever level an earlier command left on the root logger
  logger.addHandler(handler)
  with jax.log_compiles(True):
    yield handler
  logger.removeHandler(handler)
  logger.setLevel(level)


def test_preflight_compiles_each_stage_once_and_stops_a_run_that_does_not_fit(
    tmp_path, monkeypatch, compiles):
  c = gspo.get_config('smoke')
  c.num_steps, c.eval.every, c.log.diagnostics_every = 1, 0, 0
  monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**40))  # a stated capacity: it runs
  trainer = trainer_lib.Trainer(c, str(tmp_path / 'run'))
  try:
    trainer.step(1)
    assert {f: compiles.count(f) for f in FUNCTIONS} == dict.fromkeys(FUNCTIONS, 1)
    # Known positive for the counter: the preflight through fresh jitted functions (not the
    # trainer's) compiles the behaviour pass again.
    monkeypatch.setattr(preflight, 'STAGES', ('behaviour',))
    preflight.check(c, trainer.model_config, trainer.mesh)
    assert compiles.count('behaviour_pass') == 2
    monkeypatch.undo()
    # 1 MiB: the sampler (found compiled) does not fit; named with the bytes and capacity.
    monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**20))
    with pytest.raises(
        hardware.DoesNotFit, match=r"does not fit: stage 'sample' needs .* GiB "
        r'per chip, capacity 0.00 GiB'):
      preflight.check(c, trainer.model_config, trainer.mesh, behaviour_fn=trainer._behaviour,
                      update_fn=trainer._update, tokenizer=trainer.tokenizer)
    assert compiles.count('_sample_impl') == 1
    monkeypatch.delenv('JTC_DEVICE_MEMORY_BYTES')  # a CPU's capacity is unknown: no check
    assert hardware.device_capacity(jax.devices()[0]) is None
    preflight.check(c, trainer.model_config, trainer.mesh)
  finally:
    trainer.close()


def test_gpu_target_is_labelled_an_estimate_and_checks_the_host_devices():
  """`--gpu`: JAX cannot compile for CUDA without a GPU, so the plan compiles for host devices
  with the GPU's constants and says so; a device count the host was not given is an error."""
  from jtc.cli import plan as plan_main  # pylint: disable=import-outside-toplevel
  devices, platform, chip, where, compiled_for = plan_main.target('h100', 1, None, 1)
  assert (len(devices), platform, chip) == (1, 'gpu', hardware.CHIPS['h100'])
  assert 'estimate, not compiled for the GPU' in compiled_for and 'h100' in where
  with pytest.raises(ValueError, match='--gpus=8: 1 host devices'):
    plan_main.target('h100', 8, None, 1)


# CI time: the LoRA state the preflight adds up is checked fast in test_stages / test_estimate.
@pytest.mark.slow
def test_preflight_checks_a_lora_run_through_its_own_functions(tmp_path, monkeypatch, compiles,
                                                               capsys):
  """A LoRA run (rank 4, a KL term against the base): the preflight compiles the functions its
  steps call (each once over a step); 1 MiB stops a 2-member LoRA population before any
  rollout."""
  c = gspo.get_config('smoke')
  c.num_steps, c.eval.every, c.log.diagnostics_every = 1, 0, 0
  c.lora.rank, c.loss.hparams.kl_coef = 4, 0.01
  monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**40))
  trainer = trainer_lib.Trainer(c, str(tmp_path / 'run'))
  try:
    assert trainer.frozen is not None and trainer.ref_params is trainer.frozen
    err = capsys.readouterr().err
    assert all(f'preflight: {stage} compiled' in err
               for stage in ('sample', 'behaviour', 'reference', 'update'))
    trainer.step(1)
    # The reference policy (the base alone: adapters None) is a second program of the
    # behaviour pass; each compiled once, by the preflight.
    assert {
        f: compiles.count(f) for f in FUNCTIONS
    } == dict(_sample_impl=1, behaviour_pass=2, update_step=1)
  finally:
    trainer.close()
  c.population.size = 2
  monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**20))
  with pytest.raises(hardware.DoesNotFit, match=r"does not fit: stage 'sample' needs"):
    trainer_lib.Trainer(c, str(tmp_path / 'small'))
