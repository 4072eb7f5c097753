"""The rollout's decoding settings (`jtc.rl.decoding`): the slot count a plan's sample stage
compiles and reports is the one the sampler takes from the same free memory; it shrinks with the
memory it is derived from (and with a population's members); the decode layout 'auto' chooses
follows the free memory, and `sharding.decode_layout` takes the same choice (abstract meshes,
nothing compiles)."""
import pytest

from jtc.models import decode_loop
from jtc.models import sampler as sampler_lib
from jtc.plan import hardware
from jtc.rl import decoding
from jtc.rl import sharding
from jtc.rl import stages
from tests.rl import test_step

GIB = 2**30


def _sample_stage(free_bytes, **overrides):
  step = test_step._step(test_step._config(**overrides), fsdp=4)  # pylint: disable=protected-access
  (stage,) = stages.build(step, 'tpu', only=('sample',), free_bytes=free_bytes)
  return step, stage


def _half_rows_free(step, rows):
  """Free bytes whose half holds rows / 2 + 1/2 completion caches (slots = rows // 2)."""
  T = step.c.rollout.sampling.max_new_tokens
  row = decode_loop.row_bytes(step.sampler_config, T,
                              sampler_lib.resolve_block_size(None, T, 'tpu'))
  return int((rows // 2 + 0.5) * row / decode_loop.SLOT_MEMORY_FRACTION)


def test_the_plans_slot_count_is_the_samplers(monkeypatch):
  c = {'rollout.scheduler': 'continuous', 'rollout.chunk_prompts': 4}
  step, _ = _sample_stage(None, **c)
  rows = 4 * step.c.rollout.sampling.num_samples
  free = _half_rows_free(step, rows)
  _, stage = _sample_stage(free, **c)
  d = stage.decoding
  assert d.slots == rows // 2 and stage.kwargs['slots'] == d.slots  # what compiles
  assert f'{d.slots} decode slots for {rows} rows' in d.describe()
  # The sampler, its devices reporting the same free memory, takes the same count.
  monkeypatch.setattr(decode_loop, 'free_device_bytes', lambda: free)
  decode_loop._memory_slots.cache_clear()  # pylint: disable=protected-access
  _, static = sampler_lib.program(step.sampler_config, step.c.data.prompt_width, members=False,
                                  platform='tpu', eos_id=1, pad_id=0, num_prompts=4,
                                  scheduler='continuous', **step.c.rollout.sampling.to_dict())
  decode_loop._memory_slots.cache_clear()  # pylint: disable=protected-access
  assert static['slots'] == d.slots
  # A configured count wins (clipped to the call's rows); static compiles no slots.
  _, stage = _sample_stage(free, **c, **{'rollout.decode_slots': 3})
  assert stage.decoding.slots == 3 and 'decode_slots=3' in stage.decoding.describe()
  _, stage = _sample_stage(free, **{'rollout.chunk_prompts': 4})
  assert stage.kwargs['slots'] is None and stage.decoding.slots == rows // 2
  assert f'continuous would run {rows // 2}' in stage.decoding.describe()


def test_slots_shrink_with_the_memory_they_are_derived_from():
  step, _ = _sample_stage(None)
  T = step.c.rollout.sampling.max_new_tokens
  rows = 4 * step.c.rollout.sampling.num_samples

  def slots(free, members=1, rows=rows, T=T):
    return decoding.resolve(step.c.rollout, step.sampler_config, None, rows=rows, max_new_tokens=T,
                            block_size=128, free_bytes=free, members=members).slots

  top = _half_rows_free(step, rows) * 4
  counts = [slots(int(top * f)) for f in (1.0, 0.5, 0.25, 0.1, 0.01, 0.0)]
  assert counts == sorted(counts, reverse=True) and counts[0] == rows and counts[-1] == 1
  assert len(set(counts)) >= 4  # strictly smaller at several steps, not flat
  assert slots(int(top * 0.25), members=2) == slots(int(top * 0.125))  # two members share it
  # The plan's free memory: the chip's less the resident state. A smaller chip, fewer slots
  # (2048 rows of 32k tokens: more than either holds).
  small, large = (decoding.planned_free_bytes(hardware.CHIPS[n].hbm_bytes, step.resident(), 4)
                  for n in ('v5e', 'v5p'))
  long = lambda free: slots(free, rows=2048, T=32768)
  assert small < large and 1 < long(small) < long(large) < 2048
  assert decoding.planned_free_bytes(1.0, 2.0, 4) == 0


@pytest.mark.parametrize('fsdp, free_gib, want', [(1, None, 'fsdp'), (4, None, 'tensor'),
                                                  (4, 1000.0, 'tensor'), (4, 0.5, 'fsdp')])
def test_auto_layout_follows_the_free_memory(fsdp, free_gib, want):
  step = test_step._step(test_step._config(), fsdp=fsdp)  # pylint: disable=protected-access
  free = None if free_gib is None else int(free_gib * GIB)
  d = decoding.resolve(step.c.rollout, step.sampler_config, step.mesh, rows=8, max_new_tokens=16,
                       block_size=16, free_bytes=free)
  assert d.layout == want and f'decode layout {want}' in d.describe()
  layout = sharding.decode_layout('auto', step.mesh, step.sampler_config, free)
  assert (layout is not None) == (want == 'tensor')
