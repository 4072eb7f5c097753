"""Tests of experiments/sweeps/claims.py: every claim names runs of its sweep (arm, baseline, group)
and a metric a table of the sweep reads; names are unique; confirmatory claims are on fresh seeds
and have a SESOI; the exploratory claims are exactly the sweeps' paper-sign comparisons."""
from experiments import common
from experiments import sweeps as sweeps_lib
from experiments.sweeps import claims


def test_every_claim_names_runs_and_a_metric_of_its_sweep():
  every = claims.all_claims()
  assert len({c.name for c in every}) == len(every)
  for c in every:
    sweep = sweeps_lib.get_sweep(c.sweep)
    runs = {(r.group, r.label) for r in sweep.runs}
    assert (c.group, c.arm) in runs, c.name
    assert not c.baseline or (c.group, c.baseline) in runs, c.name  # '': against 0
    assert c.metric.partition(':')[0] in common.EXTRACTORS, c.name


def test_confirmatory_claims_are_on_fresh_seeds_with_a_sesoi():
  confirmatory = [c for c in claims.all_claims() if c.kind == 'confirmatory']
  assert {c.family for c in confirmatory} == {
      'Table 1', 'Mechanism', 'Off-policy', 'Table 4', 'DelTA', 'Step size', 'Batching',
      'Diagnoses', 'Best vs best'
  }
  for c in confirmatory:
    assert sweeps_lib.get_sweep(c.sweep).first_seed >= 8, c.name  # seeds 0-7 chose the settings
    assert c.sesoi and c.sesoi_why and c.predicted in ('>', '<', '='), c.name


def test_confirmatory_sweeps_of_issue_54_use_seeds_no_earlier_confirmatory_sweep_used():
  """Seeds 8-23 and 24-39 ran the earlier confirmatory sweeps; the new ones are disjoint from
  them and from each other."""

  def seeds(name):
    s = sweeps_lib.get_sweep(name)
    return set(range(s.first_seed, s.first_seed + s.seeds))

  earlier = set().union(*(seeds(n) for n in ('table1_confirm', 'offpolicy_confirm',
                                             'table4_confirm', 'delta_confirm', 'table4_crn',
                                             'offpolicy_gated_confirm', 'stepsize_confirm')))
  new = [seeds('batching'), seeds('credit_probe'), seeds('best_vs_best')]
  assert all(not s & earlier and len(s) == 16 and max(s) < 100 for s in new)
  assert not set.intersection(*new)


def test_exploratory_claims_are_the_paper_sign_comparisons_of_the_tables():
  sweep = sweeps_lib.get_sweep('table4')
  derived = claims.exploratory_claims([sweep])
  expected = sum(len(t.expect) for t in sweep.tables)
  assert len(derived) == expected > 0
  assert all(c.kind == 'exploratory' and c.sweep == 'table4' for c in derived)
