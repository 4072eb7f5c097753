"""A mixture-of-experts policy's routing in the RL step: which experts the passes replay, the
routing flips logged every step, and the checks of the keys that only a MoE policy accepts.

`config.rollout.routing_replay` (`REPLAYS`):
  none       the behaviour pass and the updates route every token as their router decides;
  behaviour  every completion token is routed to the experts the sampler used for it (the
             router's probabilities of those experts still weigh them and get the gradient:
             routing replay, "R3"); the prompt's tokens are routed by the router;
  all        the prompt's tokens too, to the experts of the sampler's prefill.
The sampler's experts come from `jtc.models.sampler.sample(..., return_routing=True)`
(`Rollout.experts_BLYW`); a token the sampler never fed (a row's last) is routed by the router.

Every step of a MoE run logs `mismatch/routing_flip_rate` (completion tokens whose set of
experts differs between the sampler and the behaviour pass's own router in some layer),
`mismatch/routing_flip_rate_layer<y>` and `mismatch/routing_abs_delta_share` (the share of
sum |log pi_train - log pi_sampler| on those tokens; `jtc.analysis.mismatch`), and `router_aux`
(the load-balancing loss, `jtc.models.moe`), which `config.loss.router_aux_coef` adds to the loss.

Dimension key (docs/dimensions.md): B rows, P prompt width, T completion length, L = P + T,
Y layers, W experts per token.
"""

import jax.numpy as jnp
import numpy as np

from jtc import checks
from jtc.analysis import mismatch

REPLAYS = ('none', 'behaviour', 'all')


def check_config(c, model_config, population_size=1):
  """The MoE keys against the policy: a ValueError naming the key and its valid values."""
  replay = c.rollout.get('routing_replay', 'none')
  checks.choice('config.rollout.routing_replay', replay, REPLAYS)
  coef = c.loss.get('router_aux_coef', 0.0)
  checks.in_range('config.loss.router_aux_coef', coef, low=0.0)
  expert_axis = c.mesh.get('expert', 1)
  if not model_config.is_moe:
    for key, value, off in (('rollout.routing_replay', replay, 'none'),
                            ('loss.router_aux_coef', coef, 0.0), ('mesh.expert', expert_axis, 1),
                            ('policy.moe_dispatch', c.policy.get('moe_dispatch',
                                                                 'replicated'), 'replicated')):
      if value != off:
        raise ValueError(f'config.{key}={value!r} needs a mixture-of-experts policy; this one '
                         f'is dense (n_experts=0): set it to {off!r}')
    return
  X = model_config.n_experts
  if expert_axis < 1 or X % expert_axis:
    raise ValueError(f'config.mesh.expert={expert_axis} must divide the policy\'s '
                     f'n_experts={X} (valid: {[d for d in range(1, X + 1) if X % d == 0]})')
  if population_size > 1 and model_config.moe_impl == 'ragged':
    raise ValueError("a population of a mixture-of-experts policy with moe_impl='ragged': "
                     "jax.lax.ragged_dot's weight gradient has no batching rule under the "
                     "members' vmap; set config.policy.overrides.moe_impl to 'blocks' or 'dense'")
  if population_size > 1 and model_config.moe_dispatch == 'all_to_all':
    raise ValueError("a population of a mixture-of-experts policy with moe_dispatch='all_to_all': "
                     "the token exchange does not run under the members' vmap; set "
                     "config.policy.moe_dispatch to 'replicated'")
  if c.lora.rank:
    targets = {t.strip() for t in str(c.lora.targets).split(',')}
    if targets & {'gate', 'up', 'down'}:
      raise ValueError(f'config.lora.targets={c.lora.targets!r} on a mixture-of-experts policy: '
                       "its experts take no adapters; valid targets: 'q', 'k', 'v', 'o'")


def add_router_aux(loss_and_metrics, out, coef):
  """An objective's (loss, metrics) plus ``coef`` x a MoE policy's load-balancing loss
  (`sequence_logprobs`'s 'router_aux'), which the metrics log as 'router_aux' (a dense policy's
  pass through unchanged)."""
  loss, metrics = loss_and_metrics
  if 'router_aux' not in out:
    return loss, metrics
  return loss + coef * out['router_aux'], {**metrics, 'router_aux': out['router_aux']}


def needs_routing(c, model_config) -> bool:
  """Whether the rollouts keep the sampler's experts: every MoE run (the flip metrics)."""
  return model_config.is_moe


def replay_experts(experts_BLYW, mode, prompt_width):
  """The experts the passes replay for ``mode`` (`REPLAYS`): None ('none'), the sampler's for the
  completion tokens and -1 (the router decides) for the prompt ('behaviour'), or all of them
  (host arrays [(E,) B, L, Y, W])."""
  if mode == 'none' or experts_BLYW is None:
    return None
  if mode == 'behaviour':
    experts_BLYW = np.array(experts_BLYW)
    experts_BLYW[..., :prompt_width, :, :] = -1
  return experts_BLYW


def step_metrics(sampler_experts_BTYW, trainer_experts_BTYW, delta_BT, mask_BT):
  """The routing flips of a step's completion tokens as flat metrics: 'routing_flip_rate',
  'routing_flip_rate_layer<y>', 'routing_abs_delta_share' (jit-able)."""
  flips_BTY = mismatch.routing_flips(sampler_experts_BTYW, trainer_experts_BTYW)
  m = mismatch.routing_metrics(flips_BTY, delta_BT, mask_BT)
  out = {'routing_flip_rate': m['flip_rate'], 'routing_abs_delta_share': m['abs_delta_share']}
  out.update({f'routing_flip_rate_layer{y}': r for y, r in enumerate(m['flip_rate_layer'])})
  return out


def token_flips(sampler_experts_BTYW, trainer_experts_BTYW, mask_BT):
  """[B, T] bool: the real tokens whose experts differ in some layer (the ledger's column)."""
  flips_BTY = mismatch.routing_flips(sampler_experts_BTYW, trainer_experts_BTYW)
  return jnp.any(flips_BTY, axis=-1) & (mask_BT > 0)
