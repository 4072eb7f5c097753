"""Tests of jtc.rl.sft_trainer: the SFT pairs (left-padded prompt, right-padded EOS-terminated
completion, the loss mask on the completion only) and one SFT step lowering the completion
negative log-likelihood it is the gradient of."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import sft_trainer as sft

P, T = 10, 5


def test_pairs_are_left_padded_prompts_then_eos_terminated_completions():
  tok = tokenizer_lib.from_spec({'kind': 'char'})
  tokens, input_mask, mask_BT = sft.encode_pairs(tok, ['1+2', '12+30'], ['3', '42'], prompt_width=P,
                                                 completion_width=T)
  assert tokens.shape == (2, P + T) and mask_BT.shape == (2, T)
  np.testing.assert_array_equal(mask_BT, [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(tokens[:, P:][mask_BT > 0],
                                tok.encode('3') + [tok.eos_id] + tok.encode('42') + [tok.eos_id])
  assert input_mask[0, 0] == 0 and input_mask[0, P - 1] == 1  # the prompt is left-padded
  with pytest.raises(ValueError, match='more than completion_width=5'):
    sft.encode_pairs(tok, ['1'], ['123456'], prompt_width=P, completion_width=T)


def test_an_sft_step_lowers_the_completion_nll():
  tok = tokenizer_lib.from_spec({'kind': 'char'})
  mc = model_lib.ModelConfig.tiny(vocab_size=tok.vocab_size, n_layers=1, d_ff=64)
  params = model_lib.init_params(mc, jax.random.key(0))
  batch = sft.encode_pairs(tok, ['1+2', '2+2'], ['3', '4'], prompt_width=P, completion_width=T)
  optimizer = optax.sgd(0.1)
  step = jax.jit(
      functools.partial(sft.sft_step, model_config=mc, optimizer=optimizer, prompt_width=P))
  opt_state = optimizer.init(params)
  params, opt_state, first, aux = step(params, opt_state, *batch)
  _, _, second, _ = step(params, opt_state, *batch)
  assert float(second) < float(first) and float(aux) == 0  # a dense policy has no router
  assert sft.eval_sampling(4, T)['temperature'] == 1.0


@pytest.mark.slow
def test_a_moe_sft_step_adds_the_load_balancing_loss():
  """The step's gradient is that of NLL + coef * router_aux: with coef 0 the router only gets the
  NLL's gradient, so the two steps' router updates differ; the reported aux is the policy's."""
  tok = tokenizer_lib.from_spec({'kind': 'char'})
  mc = model_lib.ModelConfig.tiny_moe(vocab_size=tok.vocab_size, n_layers=1, d_expert=16)
  params = model_lib.init_params(mc, jax.random.key(0))
  batch = sft.encode_pairs(tok, ['1+2', '2+2'], ['3', '4'], prompt_width=P, completion_width=T)
  optimizer = optax.sgd(1.0)
  routers = {}
  for coef in (0.0, 10.0):
    step = functools.partial(sft.sft_step, model_config=mc, optimizer=optimizer, prompt_width=P,
                             router_aux_coef=coef)
    new, _, loss, aux = jax.jit(step)(params, optimizer.init(params), *batch)
    routers[coef] = new['layers']['mlp']['router']['kernel']
  out = logprobs.sequence_logprobs(params, mc, batch[0], batch[1], completion_start=P)
  np.testing.assert_allclose(aux, out['router_aux'], rtol=1e-6)
  assert float(jnp.max(jnp.abs(routers[10.0] - routers[0.0]))) > 1e-4
