"""jtc.interop.plain_losses: each objective written plainly has the value and the gradient of
jtc's compute_loss (an independent implementation of the same formulas), in torch and in jax, and
with the global counts a split batch's losses add up to the whole batch's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jtc import objectives
from jtc.analysis import diagnostics
from jtc.interop import conform_batches
from jtc.interop import plain_losses

SETTINGS = {
    'grpo': {
        'dual_clip_c': 3.0
    },
    'dfpo_pos_orth_proj': {
        'solver': 'truncate_rebalance'
    },
    'dfpo_orth_proj': {
        'stop_gradient': False
    },
    'dfpo_min_replace': {
        'clip_gating': 'gspo'
    },
}


def _batch(objective):
  return conform_batches.make(objective, {}, seed=3)[0]  # 'random': near and far rows


@pytest.mark.parametrize('objective', sorted(objectives.LOSSES))
def test_value_and_gradient_equal_jtcs_compute_loss(objective):
  hp = {**SETTINGS.get(objective, {}), 'aggregation': objectives.LOSSES[objective].aggregation}
  b = _batch(objective)
  f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
  log_r = np.where(b.mask_BT > 0, b.logp_BT - b.old_logp_BT, 0.0)
  kw = dict(loss_name=objective, old_logps=f32(0 * log_r), advantages=f32(b.adv_B),
            mask=f32(b.mask_BT), group_size=b.group_size, token_weights=f32(b.token_weights_BT))
  coef, _ = diagnostics.loss_coefficients(f32(log_r), **kw, **hp)
  want_loss = objectives.compute_loss(objective, logps=f32(log_r), **{
      k: v for k, v in kw.items() if k != 'loss_name'
  }, **hp)[0]
  t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float64)
  lp = t(b.logp_BT).requires_grad_(True)
  value = getattr(plain_losses,
                  objective)(lp, t(b.old_logp_BT), t(b.adv_B), t(b.mask_BT),
                             group_size=b.group_size, token_weights=t(b.token_weights_BT), **hp)
  (grad,) = torch.autograd.grad(value, lp)
  scale = float(np.abs(np.asarray(coef)).max())
  assert float(value.detach()) == pytest.approx(float(want_loss), rel=1e-4,
                                                abs=1e-6 * max(scale, 1e-3))
  np.testing.assert_allclose(grad.numpy(), np.asarray(coef), rtol=1e-4,
                             atol=1e-5 * max(scale, 1e-3))


def test_jax_arrays_give_the_same_gradient_as_torch_tensors():
  b = _batch('dfpo_pos_orth_proj')
  kw = dict(aggregation='seq_mean_token_mean', group_size=b.group_size)
  with jax.enable_x64(True):
    args = [jnp.asarray(x) for x in (b.old_logp_BT, b.adv_B, b.mask_BT)]
    g_jax = jax.jit(jax.grad(lambda lp: plain_losses.dfpo_pos_orth_proj(lp, *args, **kw)))(
        jnp.asarray(b.logp_BT))
  t = lambda x: torch.tensor(x, dtype=torch.float64)
  lp = t(b.logp_BT).requires_grad_(True)
  (g_torch,) = torch.autograd.grad(
      plain_losses.dfpo_pos_orth_proj(lp, t(b.old_logp_BT), t(b.adv_B), t(b.mask_BT), **kw), lp)
  np.testing.assert_allclose(np.asarray(g_jax), g_torch.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize('aggregation', sorted(objectives.AGGREGATIONS))
def test_with_the_global_counts_micro_batch_losses_add_up_to_the_batch(aggregation):
  b = _batch('grpo')
  t = lambda x: torch.tensor(x, dtype=torch.float64)
  B, T = b.shape
  ctx = dict(aggregation=aggregation, num_tokens=float(b.mask_BT.sum()), num_sequences=B,
             norm_length=T)
  whole = plain_losses.grpo(t(b.logp_BT), t(b.old_logp_BT), t(b.adv_B), t(b.mask_BT), **ctx)
  parts = sum(
      plain_losses.grpo(t(m.logp_BT), t(m.old_logp_BT), t(m.adv_B), t(m.mask_BT), **ctx)
      for m in (b.rows(np.arange(0, 5)), b.rows(np.arange(5, B))))
  assert float(parts) == pytest.approx(float(whole), rel=1e-12)
