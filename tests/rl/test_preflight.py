"""The trainer's preflight (`jtc.rl.preflight`) on the CPU with a stated capacity: each stage
the trainer runs, DelTA's coefficient pass included, is compiled once (the preflight compiles
the functions the steps call), the planner's step lowers to the same programs, and a capacity
too small stops the run with `does not fit`, naming the stage."""
import dataclasses
import logging
import re

import jax
import pytest

from configs import delta
from configs import gspo
from jtc.plan import planner
from jtc.rl import preflight
from jtc.rl import trainer as trainer_lib

FUNCTIONS = ('_sample_impl', 'behaviour_pass', 'weights', 'update_step')


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


def _lowered(stage):
  return stage.fn.trace(*stage.args, **stage.kwargs).lower().as_text()


@pytest.mark.parametrize('hidden', ['held', pytest.param('recomputed', marks=pytest.mark.slow)])
def test_preflight_compiles_each_stage_once_and_stops_a_run_that_does_not_fit(
    tmp_path, monkeypatch, compiles, capsys, hidden):
  """A DelTA run with a KL term: the preflight checks sample, behaviour, reference, delta and
  update, each compiled once over the preflight and a step; the planner's own step on the same
  devices lowers every stage to the trainer's program (DelTA's hidden states held, or
  recomputed by its own pass)."""
  c = delta.get_config('smoke')
  c.delta.hidden = hidden
  c.num_steps, c.eval.every, c.log.diagnostics_every = 1, 0, 0
  c.loss.hparams.kl_coef = 0.01
  monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**40))  # a stated capacity: it runs
  trainer = trainer_lib.Trainer(c, str(tmp_path / 'run'))
  try:
    err = capsys.readouterr().err
    assert all(f'preflight: {stage} compiled' in err
               for stage in ('sample', 'behaviour', 'reference', 'delta', 'update'))
    trainer.step(1)
    assert {f: compiles.count(f) for f in FUNCTIONS} == dict.fromkeys(FUNCTIONS, 1)
    # The planner builds the trainer's step: every stage lowers to the same program text.
    devices = list(trainer.mesh.devices.flat)
    planned = dataclasses.replace(planner.build_step(c, devices, 'cpu', trainer.model_config),
                                  ids=trainer.rl_step.ids)
    mine = {s.name: _lowered(s) for s in trainer.rl_step.stages('cpu')}
    assert {s.name: _lowered(s) for s in planned.stages('cpu')} == mine
    # Known positive for the counter: the planner's step (fresh jitted functions, not the
    # trainer's) compiles the behaviour pass again.
    monkeypatch.setattr(preflight, 'STAGES', ('behaviour',))
    preflight.check(planned)
    assert compiles.count('behaviour_pass') == 2
    monkeypatch.undo()
    # 1 MiB: the sampler (found compiled) does not fit; named with the bytes and capacity.
    monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**20))
    with pytest.raises(
        preflight.DoesNotFit, match=r"does not fit: stage 'sample' needs .* GiB "
        r'per chip, capacity 0.00 GiB'):
      preflight.check(trainer.rl_step)
    assert compiles.count('_sample_impl') == 1
    monkeypatch.delenv('JTC_DEVICE_MEMORY_BYTES')  # a CPU's capacity is unknown: no check
    assert preflight.device_capacity(jax.devices()[0]) is None
    preflight.check(trainer.rl_step)
  finally:
    trainer.close()


def test_does_not_fit_names_the_stage_the_bytes_and_the_capacity():
  message = preflight.does_not_fit('update', 20 * preflight.GIB, 16 * preflight.GIB, 'v5e:2x2')
  assert message == ("does not fit: stage 'update' needs 20.00 GiB per chip, capacity 16.00 GiB "
                     '(v5e:2x2)')


# CI time: the LoRA state the preflight adds up is checked fast in tests/rl/test_step.py.
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
        f: compiles.count(f) for f in FUNCTIONS if f != 'weights'
    } == dict(_sample_impl=1, behaviour_pass=2, update_step=1)
  finally:
    trainer.close()
  c.population.size = 2
  monkeypatch.setenv('JTC_DEVICE_MEMORY_BYTES', str(2**20))
  with pytest.raises(preflight.DoesNotFit, match=r"does not fit: stage 'sample' needs"):
    trainer_lib.Trainer(c, str(tmp_path / 'small'))
