"""The per-token notebook's shared-prefix cancellation check (notebooks/per_token_gradients.ipynb,
paper 2604.13088 Prop. 3.1 / Eq. 2) on tiny hybrids: in a linear-attention layer a token's
context reaches it through a recurrent state instead of attention scores, but positions whose
whole group shares prompt, prefix and token still have one score vector, so GRPO's and DFPO's
coefficients cancel there (known positive) and GSPO's do not (known negative).

The policies: jtc's own `tiny_hybrid` (random init), and a Qwen3.5 and a Qwen3-Next (hybrid +
mixture of experts) written by transformers and imported (tests/models/hf_hybrids.py), so the
sampler, the token ledger and the exact per-token gradient norms run on the imported models."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jtc.analysis import diagnostics
from jtc.analysis import grad_norms
from jtc.analysis import ledger
from jtc.models import hf_import
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models import sampler
from jtc.models.model_config import ModelConfig
from jtc.objectives import advantages

# Each policy compiles its own sampler and Jacobians (about a minute): the end-to-end set.
pytestmark = pytest.mark.slow

G, PREFIX, T = 4, 3, 4
V = 16


def _policy(name, directory):
  """(config, params) of policy ``name``, 4-token chunks (the 7-token prompt crosses one)."""
  if name == 'tiny_hybrid':
    config = ModelConfig.tiny_hybrid(vocab_size=V, d_model=32, head_dim=8, d_ff=48,
                                     linear_k_head_dim=8, linear_v_head_dim=8)
    params = model_lib.init_params(config, jax.random.key(0))
  else:
    hf_hybrids = pytest.importorskip('tests.models.hf_hybrids')
    getattr(hf_hybrids, f'write_{name}')(directory, vocab_size=V)
    config, params = hf_import.load_hf_checkpoint(directory)
  return dataclasses.replace(config, linear_chunk=4), params


# The imported checkpoints' runs are slow (each compiles its own sampler and Jacobians).
POLICIES = ['tiny_hybrid'
           ] + [pytest.param(n, marks=pytest.mark.slow) for n in ('qwen3_5', 'qwen3_next')]


@pytest.fixture(scope='module', params=POLICIES)
def group(request, tmp_path_factory):
  config, params = _policy(request.param, tmp_path_factory.mktemp(request.param))
  assert {'linear_attention', 'full_attention'} <= set(config.layer_types)
  prompt_BP = jnp.array([[3, 5, 7, 9, 2, 4, 6]], jnp.int32)  # the last PREFIX: the forced prefix
  out = sampler.sample(params, config, prompt_BP, jnp.ones_like(prompt_BP), rng=jax.random.key(1),
                       num_samples=G, max_new_tokens=T, eos_id=15, pad_id=0)
  P = prompt_BP.shape[1] - PREFIX
  tokens, input_mask = out.tokens_RL, out.input_mask_RL
  mask = jnp.concatenate([jnp.ones((G, PREFIX)), out.completion_mask_RT], 1).astype(jnp.float32)
  adv, _ = advantages.compute_advantages('grpo', jnp.array([1.0, 0.0, 0.0, 1.0]), group_size=G)
  noise = jax.tree.map(lambda x: 1e-2 * jax.random.normal(jax.random.key(2), x.shape), params)
  old_params = jax.tree.map(jnp.add, params, noise)
  logps = logprobs.sequence_logprobs(params, config, tokens, input_mask,
                                     completion_start=P)['logps']
  old_logps = logprobs.sequence_logprobs(old_params, config, tokens, input_mask,
                                         completion_start=P)['logps']
  norms = grad_norms.exact_grad_norms(params, config, tokens, input_mask, completion_start=P)
  return config, params, tokens, input_mask, mask, adv, logps, old_logps, P, norms


# Clips widened so that no token is clipped at this distance from the old policy: sign-asymmetric
# clipping breaks the cancellation by itself (the paper's other cause), so the positive control
# isolates exchangeable token weights (GRPO, DFPO) from GSPO's sequence weights s_i, which
# differ between the rows (the negative control).
HPARAMS = {'grpo': {'eps_low': 10.0, 'eps_high': 10.0}, 'gspo': {'eps': 0.5}}


@pytest.mark.parametrize('loss, cancels', [('grpo', True), ('dfpo_min_replace', True),
                                           ('gspo', False)])
def test_shared_prefix_gradients_cancel_on_a_hybrid(group, loss, cancels):
  config, params, tokens, input_mask, mask, adv, logps, old_logps, P, norms = group
  shared = diagnostics.shared_context_mask(tokens, input_mask, mask, group_size=G,
                                           completion_start=P)
  assert int(shared[0].sum()) >= PREFIX
  cols = ledger.token_ledger(logps, tokens_BL=tokens, input_mask_BL=input_mask,
                             old_logps_BT=old_logps, advantages_B=adv, mask_BT=mask, group_size=G,
                             completion_start=P, loss_name=loss, loss_hparams={
                                 'aggregation': 'token_mean',
                                 **HPARAMS.get(loss, {})
                             })
  coef = cols['coef']
  net_T = diagnostics.position_net_grad_norms(params, config, tokens, input_mask, coef,
                                              completion_start=P)
  gross_T = jnp.sum(jnp.abs(coef) * norms, axis=0)
  rel = np.asarray(net_T[:PREFIX] / gross_T[:PREFIX])
  residual = float(
      diagnostics.shared_token_residual(coef, norms, shared, mask, group_size=G)['residual'])
  if cancels:
    assert rel.max() < 1e-3 and residual < 1e-5, (rel, residual)
  else:
    assert rel.max() > 1e-2 and residual > 1e-4, (rel, residual)
