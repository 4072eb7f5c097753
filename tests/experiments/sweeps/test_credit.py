"""Tests of experiments/sweeps/credit.py: the batching arms differ from whole-group GRPO only in
the mini-batch order (or the advantage sign), at the table1_confirm training, on fresh seeds;
the smoke form has two mini-batches, so its orders are meaningful."""
from experiments import sweeps as sweeps_lib
from experiments.sweeps import credit


def test_the_arms_differ_only_in_the_order_or_the_sign():
  sweep = sweeps_lib.get_sweep('batching')
  assert (sweep.first_seed, sweep.seeds) == (credit.FIRST_SEED, 16)
  base = {k: v for k, v in sweep.runs[0].overrides}
  for r in sweep.runs:
    o = dict(r.overrides)
    assert r.config == 'grpo' and o['optim.learning_rate'] == 1e-4
    assert set(o) - {'optim.minibatch_order', 'advantage.sign'
                    } == set(base) - {'optim.minibatch_order'}
  orders = [dict(r.overrides)['optim.minibatch_order'] for r in sweep.runs]
  assert orders == ['group', 'shuffled', 'reward_balanced', 'group']
  assert dict(sweep.shared)['log.diagnostics_every'] == 0  # refused with a row order


def test_the_smoke_form_has_two_minibatches():
  from configs import grpo  # pylint: disable=import-outside-toplevel
  smoke = sweeps_lib.get_sweep('batching', smoke=True)
  c = grpo.get_config('smoke')
  for r in smoke.runs:
    assert c.rollout.prompts_per_step // dict(r.overrides)['optim.minibatch_prompts'] == 2
