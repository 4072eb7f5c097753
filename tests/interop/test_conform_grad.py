"""jtc.interop.conform_grad: the function under test imports by MODULE:FUNCTION or fails in one
line saying why; a non-scalar result is refused; the gradient of a known function is exact under
torch, jax and numpy; the context keywords reach only a function that names them."""
import re

import numpy as np
import pytest

from jtc.interop import conform_batches
from jtc.interop import conform_grad


def square(logp, old_logp, advantages, mask, *, scale=1.0, num_tokens=None):
  """sum scale (logp - old)^2 mask / num_tokens: gradient 2 scale (logp - old) mask / num_tokens."""
  return scale * ((logp - old_logp)**2 * mask).sum() / num_tokens


def per_row(logp, old_logp, advantages, mask):
  return (logp * mask).sum(-1)


def pair(logp, old_logp, advantages, mask):
  return (logp * mask).sum(), {}


@pytest.mark.parametrize('spec, message', [
    ('nocolon', 'expected MODULE:FUNCTION'),
    ('no_such_module_xyz:f', 'cannot import no_such_module_xyz (ModuleNotFoundError'),
    ('tests.interop.test_conform_grad:nope', "has no 'nope'"),
    ('tests.interop.test_conform_grad:np', 'is a module, not a function'),
])
def test_load_names_what_is_wrong(spec, message):
  with pytest.raises(conform_grad.LossError, match=re.escape(message)):
    conform_grad.load(spec)


def test_load_finds_a_function():
  assert conform_grad.load('tests.interop.test_conform_grad:square') is square


def _batch():
  return conform_batches.make('grpo', {}, seed=2)[0]


@pytest.mark.parametrize('framework', ['torch', 'jax', 'numpy'])
def test_the_gradient_of_a_known_function_is_exact(framework):
  b = _batch()
  n = float(b.mask_BT.sum())
  fn = square
  if framework == 'numpy':
    fn = lambda lp, old, a, m, scale=1.0, num_tokens=None: float(scale * (
        (lp - old)**2 * m).sum() / num_tokens)
  call = conform_grad.Caller(fn, framework, {'scale': 3.0}, name='square', aggregation='x')
  value, g = call(b, num_tokens=n)
  d = (b.logp_BT - b.old_logp_BT) * b.mask_BT
  assert value == pytest.approx(3.0 * (d**2).sum() / n, rel=1e-12)
  np.testing.assert_allclose(g, 6.0 * d / n, rtol=1e-6 if framework == 'numpy' else 1e-12,
                             atol=1e-9 if framework == 'numpy' else 1e-15)


@pytest.mark.parametrize('fn, message', [(per_row, 'array of shape (16,), not a scalar'),
                                         (pair, 'returned a tuple, not a scalar')])
def test_a_non_scalar_result_is_refused_by_name(fn, message):
  call = conform_grad.Caller(fn, 'torch', {}, name='mine', aggregation='token_mean')
  with pytest.raises(conform_grad.LossError, match=re.escape(message)):
    call(_batch())


def test_context_reaches_only_the_names_a_function_takes():
  assert conform_grad.accepted(square) == {'num_tokens'}
  assert conform_grad.accepted(per_row) == set()
  assert conform_grad.accepted(lambda *a, **k: 0) == set(conform_grad.CONTEXT)
