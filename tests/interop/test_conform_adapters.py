"""jtc.interop.conform_adapters: prime-rl's loss structure (compute_loss over per-sample losses,
here around a re-expression of its default loss, prime-rl not being on PyPI) conforms to DAPO
when its DPPO mask and KL term are off and is flagged when they are on; verl's and TRL's installed
losses conform to jtc's objectives they implement (run where the packages import)."""
import pytest

from jtc.interop import conform
from jtc.interop import conform_adapters

PRIME = 'tests.interop.writers:prime_default_loss'


def _run(fn, objective, aggregation, hparams, accumulation):
  result = conform.run(fn, name=fn.__name__, objective=objective, aggregation=aggregation,
                       hparams=hparams, framework='torch', accumulation=accumulation)
  lines = conform.report(result, name=fn.__name__, objective=objective, aggregation=aggregation,
                         hparams=hparams, framework='torch', accumulation=accumulation)
  return result, '\n'.join(lines)


def test_prime_rls_loss_structure_is_dapos_without_its_mask_and_kl():
  hp = dict(loss_fn=PRIME, dppo_mask_low=1e9, dppo_mask_high=1e9, kl_tau=0.0, eps_low=0.999,
            eps_high=1e6)
  result, text = _run(conform_adapters.prime_rl_loss, 'dapo', 'token_mean', hp, 'sum')
  assert result.passed, text


def test_prime_rls_dppo_mask_is_not_ppos_clip():
  result, text = _run(conform_adapters.prime_rl_loss, 'dapo', 'token_mean', {'loss_fn': PRIME},
                      'sum')
  assert {f.check for f in result.findings if not f.passed} == {'gradient', 'weights'}, text


def test_an_adapter_whose_package_is_missing_says_so():
  with pytest.raises(conform.conform_grad.LossError, match='this adapter calls prime-rl'):
    conform_adapters.prime_rl_loss(None, None, None, None)


VERL = [
    (dict(policy_loss='vanilla', eps_low=0.2, eps_high=0.28,
          dual_clip_c=3.0), 'dapo', 'token_mean'),
    (dict(policy_loss='vanilla', dual_clip_c=3.0), 'grpo', 'seq_mean_token_mean'),
    (dict(policy_loss='vanilla', dual_clip_c=3.0), 'dr_grpo', 'seq_mean_token_sum_norm'),
    (dict(policy_loss='gspo', eps_low=3e-4, eps_high=4e-4), 'gspo_token', 'seq_mean_token_mean'),
]


@pytest.mark.parametrize('hp, objective, aggregation', VERL)
def test_verls_installed_policy_losses_conform(hp, objective, aggregation):
  pytest.importorskip('verl.trainer.ppo.core_algos')
  result, text = _run(conform_adapters.verl_policy_loss, objective, aggregation, hp, 'sum')
  assert result.passed, text


@pytest.mark.parametrize('hp, objective, aggregation, accumulation', [
    (dict(loss_type='dapo', eps_high=0.28), 'dapo', 'token_mean', 'sum'),
    (dict(loss_type='grpo'), 'grpo', 'seq_mean_token_mean', 'mean'),
])
def test_trls_installed_grpo_loss_conforms(hp, objective, aggregation, accumulation):
  pytest.importorskip('trl.trainer.grpo_trainer')
  result, text = _run(conform_adapters.trl_grpo_loss, objective, aggregation, hp, accumulation)
  assert result.passed, text


def test_trls_bnpo_token_mean_depends_on_the_micro_batch_split():
  pytest.importorskip('trl.trainer.grpo_trainer')
  result, text = _run(conform_adapters.trl_grpo_loss, 'dapo', 'token_mean',
                      dict(loss_type='bnpo', eps_high=0.28), 'mean')
  assert {f.check for f in result.findings if not f.passed} == {'micro-batch',
                                                                'data-parallel'}, text
