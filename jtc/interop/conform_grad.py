"""The function under test, called the way `jtc conform` calls it: importing ``MODULE:FUNCTION``,
what of the batch's context it is given, and its per-token gradient d loss / d logp by autograd
(torch, float64; jax, float64 under `jax.enable_x64`) or by central differences (numpy).

The function is ``fn(logp, old_logp, advantages, mask, **hparams) -> scalar loss``. Besides the
hyper-parameters it gets each of these keyword arguments that its signature names (or all, with
``**kwargs``): ``aggregation``, ``group_size``, ``num_tokens`` / ``num_sequences`` (the global
batch's real tokens and rows, when it sees a micro-batch or a shard), ``dp_size`` (ranks the
gradient is averaged over), ``norm_length`` (the constant length of seq_mean_token_sum_norm) and
``token_weights`` (token-weighted objectives).

Dimension key (docs/dimensions.md): B rows, T completion length.
"""

import importlib
import inspect
import os
import sys

import numpy as np

FRAMEWORKS = ('torch', 'jax', 'numpy')
CONTEXT = ('aggregation', 'group_size', 'num_tokens', 'num_sequences', 'dp_size', 'norm_length',
           'token_weights')


class LossError(ValueError):
  """The function under test cannot be imported or called as conform needs (one line)."""


def load(spec):
  """The callable named ``MODULE:FUNCTION`` (the current directory importable, as with python -m);
  LossError naming what is wrong."""
  module_name, colon, attr = spec.partition(':')
  if not colon or not module_name or not attr:
    raise LossError(f'--loss {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.losses:grpo_loss')
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0] if str(e).strip() else ''
    raise LossError(f'--loss {spec}: cannot import {module_name} ({type(e).__name__}: '
                    f'{reason})') from None
  for part in attr.split('.'):
    if not hasattr(obj, part):
      raise LossError(f'--loss {spec}: {module_name} has no {attr!r}')
    obj = getattr(obj, part)
  if not callable(obj):
    raise LossError(f'--loss {spec}: {attr} is a {type(obj).__name__}, not a function')
  return obj


def accepted(fn):
  """The context keywords ``fn`` takes (all of them if it has ``**kwargs``)."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return set(CONTEXT)
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
    return set(CONTEXT)
  return {p.name for p in params} & set(CONTEXT)


def _scalar(name, value, framework):
  shape = tuple(getattr(value, 'shape', ()))
  if isinstance(value, (tuple, list, dict)):
    raise LossError(f'{name} returned a {type(value).__name__}, not a scalar loss (wrap it so it '
                    'returns the loss alone)')
  if int(np.prod(shape)) != 1:
    raise LossError(f'{name} returned an array of shape {shape}, not a scalar loss')
  if framework == 'numpy' and not isinstance(value, (float, int, np.floating, np.ndarray)):
    raise LossError(f'{name} returned a {type(value).__name__} under --framework numpy')
  return value


class Caller:
  """Calls the function under test on a `conform_batches.Batch` and returns (loss, grad_BT)."""

  def __init__(self, fn, framework, hparams, *, name, aggregation):
    if framework not in FRAMEWORKS:
      raise LossError(f'--framework {framework!r} is not valid; valid: {", ".join(FRAMEWORKS)}')
    self.fn, self.framework, self.hparams, self.name = fn, framework, dict(hparams), name
    self.aggregation = aggregation
    self.takes = accepted(fn)

  def kwargs(self, batch, context):
    kw = {k: v for k, v in context.items() if k in self.takes and v is not None}
    return {**self.hparams, **kw}

  def __call__(self, batch, **context):
    context = dict(context, group_size=batch.group_size, token_weights=batch.token_weights_BT,
                   aggregation=self.aggregation)
    try:
      return getattr(self, f'_{self.framework}')(batch, self.kwargs(batch, context))
    except LossError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
      raise LossError(f'{self.name} failed on batch {batch.name!r} of shape {batch.shape}: '
                      f'{type(e).__name__}: {reason}') from None

  def _torch(self, batch, kw):
    import torch  # pylint: disable=import-outside-toplevel
    t = lambda x: torch.tensor(x, dtype=torch.float64)
    logp = t(batch.logp_BT).requires_grad_(True)
    if 'token_weights' in kw:
      kw['token_weights'] = t(kw['token_weights'])
    loss = _scalar(self.name,
                   self.fn(logp, t(batch.old_logp_BT), t(batch.adv_B), t(batch.mask_BT), **kw),
                   'torch')
    if not getattr(loss, 'requires_grad', False):
      return float(loss), np.zeros(batch.shape)
    value = float(loss.detach())
    (grad,) = torch.autograd.grad(loss.reshape(()), logp, allow_unused=True)
    return value, np.zeros(batch.shape) if grad is None else grad.numpy()

  def _jax(self, batch, kw):
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    with jax.enable_x64(True):
      t = lambda x: jnp.asarray(x, jnp.float64)
      if 'token_weights' in kw:
        kw['token_weights'] = t(kw['token_weights'])
      args = (t(batch.old_logp_BT), t(batch.adv_B), t(batch.mask_BT))

      def scalar(lp):
        return jnp.reshape(_scalar(self.name, self.fn(lp, *args, **kw), 'jax'), ())

      grad_fn = jax.value_and_grad(scalar)
      try:  # compiled: one XLA program per shape instead of every op on its own
        loss, grad = jax.jit(grad_fn)(t(batch.logp_BT))
      except jax.errors.JAXTypeError:  # Python control flow on values: run it op by op
        loss, grad = grad_fn(t(batch.logp_BT))
      return float(loss), np.asarray(grad, np.float64)

  def _numpy(self, batch, kw, h=1e-6):
    f = lambda lp: float(
        _scalar(self.name, self.fn(lp, batch.old_logp_BT, batch.adv_B, batch.mask_BT, **kw), 'numpy'
               ))
    base = batch.logp_BT.astype(np.float64)
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
      up, down = base.copy(), base.copy()
      up[idx] += h
      down[idx] -= h
      grad[idx] = (f(up) - f(down)) / (2 * h)
    return f(base), grad
