"""Tests of experiments/sweeps/moe.py: every method with routing replay none and behaviour under
the bfloat16 sampler, the float32-sampler control for GSPO only, all on the shipped MoE policy at
one rate, exploratory seeds 0-7."""
from experiments import sweeps as sweeps_lib
from experiments.sweeps import moe
from jtc.models import bundles


def test_every_method_with_and_without_replay_and_one_control():
  sweep = sweeps_lib.get_sweep('moe')
  assert (sweep.first_seed, sweep.seeds, sweep.num_steps) == (0, 8, moe.NUM_STEPS)
  cells = {(r.group, r.label) for r in sweep.runs}
  methods = {m.label for m in moe.METHODS}
  assert cells == {(m, l) for m in methods for l in moe.REPLAY.values()} | {('GSPO', moe.CONTROL)}
  for r in sweep.runs:
    o = dict(r.overrides)
    assert o['policy.init'] == 'moe' and o['optim.learning_rate'] == 1e-4
    assert o['rollout.sampler_dtype'] == ('float32' if r.label == moe.CONTROL else 'bfloat16')
    assert moe.REPLAY[o['rollout.routing_replay']] == r.label or r.label == moe.CONTROL
  smoke = sweeps_lib.get_sweep('moe', smoke=True)
  assert {dict(r.overrides)['rollout.routing_replay'] for r in smoke.runs} == set(moe.REPLAY)


def test_the_policy_is_a_shipped_mixture_of_experts():
  config = bundles.read_model_config(bundles.SHIPPED['moe'] + '/model.json')
  assert (config.n_experts, config.experts_per_token) == (8, 2)
