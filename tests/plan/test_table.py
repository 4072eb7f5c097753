"""What `jtc plan` prints (`jtc.plan.table`): a refused plan is its refusal (no table of zeros),
a plan of some stages gives no step time, every stage says what bounds it; stage names are
checked against the valid ones before anything compiles."""
import pytest

from jtc.plan import hardware
from jtc.plan import hlo
from jtc.plan import planner
from jtc.plan import table

V5E = hardware.CHIPS['v5e']


def _row(stage, peak_gib, *, flops=0.0, hbm=0.0, link=0.0):
  costs = hlo.Costs(flops=flops, hbm_bytes=hbm)
  costs.collective_bytes['all-gather'] = link
  seconds, bound = planner.roofline(costs, V5E)
  return planner.Row(stage, 1, peak_gib * hardware.GIB, 0, 0, 0, 0, 0, costs, 'hlo', 2.0, seconds,
                     bound=bound)


def _plan(rows, **kw):
  return planner.Plan('v5e-8', V5E, 8, {'data': 8}, rows, {'params': 0.0}, 'test',
                      stages=('prefill', 'sample', 'behaviour', 'update'), **kw)


def test_each_stage_is_bound_by_its_slowest_roofline_term():
  compute = _row('sample', 1, flops=V5E.peak_flops * 3, hbm=V5E.hbm_bandwidth)
  memory = _row('behaviour', 1, flops=V5E.peak_flops, hbm=V5E.hbm_bandwidth * 2)
  link = _row('update', 1, flops=1, link=V5E.link_bandwidth * 5)
  assert (compute.bound, memory.bound, link.bound) == ('compute', 'HBM', 'link')
  assert (compute.seconds, memory.seconds, link.seconds) == pytest.approx((3, 2, 5))
  text = table.format_table(_plan([compute, memory, link], compile_s=6.0))
  assert '| bound by |' in text and '| HBM |' in text and '| link |' in text
  assert '10 s per step' in text and 'compiled in 6 s' in text  # 3 + 2 + 5 s; its compiles


def test_a_refused_plan_prints_its_refusal_and_no_table():
  p = _plan([_row('sample', 3.0)], failure="does not fit: stage 'update': the compiler refused it",
            refused_stage='update')
  text = table.format_table(p)
  assert text.startswith("does not fit: stage 'update'") and 'sample 3.00 GiB' in text
  assert 's per step' not in text and 'MFU' not in text and '|' not in text
  assert not p.complete and p.failed_stage == 'update'


def test_a_plan_of_some_stages_gives_no_step_time():
  partial = table.format_table(_plan([_row('update', 3.0, flops=1e12)]))
  assert 'RL step: not estimated, only update compiled' in partial and 's per step' not in partial
  whole = _plan([_row(n, 1.0, flops=1e12) for n in ('sample', 'behaviour', 'update')])
  assert whole.complete and 's per step' in table.format_table(whole)
  empty = _plan([])  # nothing compiled is no fit
  assert not empty.fits and empty.verdict().startswith('nothing compiled')


def test_stage_names_are_checked_against_the_valid_ones():
  planner.check_stages(['update', 'delta'])
  with pytest.raises(ValueError, match=r"unknown stage 'updte'; valid: prefill, sample, .*eval"):
    planner.check_stages(['updte'])
