"""jtc.interop.conform: every correct jtc objective written as a plain function (torch and jax,
`jtc.interop.plain_losses`) passes every check; each known-positive control
(tests/interop/buggy_losses.py) is flagged by the check its bug breaks; the report names what
differs and the first failing batch is saved."""
import importlib.util

import numpy as np
import pytest

from jtc import cli
from jtc import objectives
from jtc.interop import conform
from jtc.interop import plain_losses
from tests import test_docs_commands
from tests.interop import buggy_losses

# Every objective with a setting that exercises it; (objective, aggregation, hparams).
CORRECT = [
    ('grpo', 'seq_mean_token_mean', {}),
    ('grpo', 'seq_mean_token_sum_norm', {
        'dual_clip_c': 3.0
    }),
    ('dapo', 'token_mean', {}),
    ('dr_grpo', 'seq_mean_token_sum', {}),
    ('grpo_fix', 'seq_mean_token_mean', {}),
    ('cispo', 'token_mean', {}),
    ('sapo', 'seq_mean_token_mean', {}),
    ('delta', 'token_mean', {}),
    ('gspo', 'seq_mean_token_mean', {}),
    ('gspo_token', 'token_mean', {}),
    ('dfpo_min_replace', 'seq_mean_token_mean', {}),
    ('dfpo_min_replace', 'seq_mean_token_mean', {
        'clip_gating': 'gspo'
    }),
    ('dfpo_orth_proj', 'token_mean', {
        'stop_gradient': False
    }),
    ('dfpo_pos_orth_proj', 'seq_mean_token_mean', {}),
    ('dfpo_pos_orth_proj', 'seq_mean_token_mean', {
        'solver': 'truncate_rebalance'
    }),
]
# In CI: one objective; the rest, and jax's compiled path per shape, are slow (jax's gradients are
# checked in CI by tests/interop/test_plain_losses.py and test_conform_grad.py).
FAST = {('grpo', 'seq_mean_token_mean', 'torch')}


def _cases():
  for objective, aggregation, hp in CORRECT:
    for framework in ('torch', 'jax'):  # every objective in both: slow
      slow = (objective, aggregation, framework) not in FAST or hp
      yield pytest.param(objective, aggregation, hp, framework,
                         marks=[pytest.mark.slow] if slow else [],
                         id=f'{objective}-{aggregation}-{framework}-{hp}')


def test_the_cases_cover_every_objective():
  assert {c[0] for c in CORRECT} == set(objectives.LOSSES)


@pytest.mark.parametrize('objective, aggregation, hp, framework', list(_cases()))
def test_a_correct_objective_written_plainly_passes_every_check(objective, aggregation, hp,
                                                                framework):
  result = conform.run(getattr(plain_losses, objective), name=objective, objective=objective,
                       aggregation=aggregation, hparams=hp, framework=framework, accumulation='sum')
  lines = conform.report(result, name=objective, objective=objective, aggregation=aggregation,
                         hparams=hp, framework=framework, accumulation='sum')
  assert result.passed, '\n'.join(lines)
  assert result.saved is None and lines[-1] == 'result: PASS: every check'
  assert {f.check for f in result.findings} == set(conform.CHECKS)


@pytest.mark.parametrize('name', sorted(buggy_losses.CONTROLS))
def test_each_known_bug_is_flagged_by_its_check(name, tmp_path):
  objective, aggregation, expected = buggy_losses.CONTROLS[name]
  save = str(tmp_path / 'first.npz')
  result = conform.run(getattr(buggy_losses, name), name=name, objective=objective,
                       aggregation=aggregation, framework='torch', accumulation='mean', save=save)
  failed = {f.check for f in result.findings if not f.passed}
  assert expected in failed, conform.report(result, name=name, objective=objective,
                                            aggregation=aggregation, hparams={}, framework='torch',
                                            accumulation='mean')
  if name == 'microbatch_token_mean':  # only the split is wrong: the full batch is right
    assert failed == {'micro-batch', 'data-parallel'}
  saved = np.load(result.saved)
  assert result.saved == save and str(saved['check']) in failed
  np.testing.assert_array_equal(saved['logp_BT'].shape, saved['jtc_coef_BT'].shape)


def test_the_micro_batch_control_passes_with_the_global_token_count():
  """A negative control for the split checks: the same DAPO token mean given the global count
  and summed, as verl's agg_loss does, is invariant."""
  result = conform.run(plain_losses.dapo, name='dapo', objective='dapo', aggregation='token_mean',
                       framework='torch', accumulation='sum')
  assert result.passed
  result = conform.run(plain_losses.dapo, name='dapo', objective='dapo', aggregation='token_mean',
                       framework='torch', accumulation='mean')
  assert {f.check for f in result.findings if not f.passed} == {'micro-batch'}


def test_the_report_says_where_and_by_how_much():
  result = conform.run(buggy_losses.ratio_dropped, name='ratio_dropped', objective='grpo',
                       aggregation='seq_mean_token_mean', framework='torch')
  lines = conform.report(result, name='ratio_dropped', objective='grpo',
                         aggregation='seq_mean_token_mean', hparams={}, framework='torch',
                         accumulation='mean')
  gradient = next(l for l in lines if 'gradient' in l)
  assert gradient.startswith('  FAIL gradient') and 'worst row' in gradient and 'ratio' in gradient
  assert 'function / jtc: median' in gradient and lines[-1].startswith('result: FAIL')
  # On policy the ratio is 1 and the bug cannot show: that batch passes.
  assert next(f for f in result.findings if f.check == 'gradient' and f.batch == 'on-policy').passed


@pytest.mark.slow  # ~10k calls of the function for the central differences
def test_numpy_by_finite_differences():
  import torch  # pylint: disable=import-outside-toplevel
  t = torch.as_tensor
  fn = lambda lp, old, a, m, **kw: float(plain_losses.grpo(t(lp), t(old), t(a), t(m), **kw))
  result = conform.run(fn, name='grpo_numpy', objective='grpo', aggregation='seq_mean_token_mean',
                       framework='numpy', accumulation='sum')
  assert result.passed


def test_numpy_cannot_check_a_stop_gradient():
  with pytest.raises(ValueError, match='finite differences cannot see'):
    conform.run(plain_losses.cispo, name='cispo', objective='cispo', aggregation='token_mean',
                framework='numpy')


def test_the_docs_commands_run(capsys):
  """docs/ledger.md, "Check a loss": the plain DAPO passes (0), the micro-batch token mean fails
  its split checks (1), verl's vanilla conforms where verl imports."""
  commands = test_docs_commands.section_commands('docs/ledger.md', 'Check a loss')
  assert len(commands) == 3
  codes = []
  for _, args in commands:
    if 'verl' in ' '.join(args) and importlib.util.find_spec('verl') is None:
      continue
    codes.append(cli.main(args))
  assert codes[:2] == [0, 1] and all(c == 0 for c in codes[2:])
  assert 'FAIL micro-batch' in capsys.readouterr().out
