"""Tests of jtc.rl.routing: the MoE keys refused with a named key on a policy that cannot take
them, the replayed experts of each mode, and the step's flip metrics."""
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from jtc.models.model_config import ModelConfig
from jtc.rl import routing

MOE = ModelConfig.tiny_moe(n_experts=8)
DENSE = ModelConfig.tiny()


def _config(**updates):
  c = common.get_config()
  for key, value in updates.items():
    section, name = key.split('.')
    c[section][name] = value
  return c


@pytest.mark.parametrize('updates, model, size, pattern', [
    ({
        'rollout.routing_replay': 'some'
    }, MOE, 1, r"routing_replay='some' is not valid; valid: \['all', 'behaviour', 'none'\]"),
    ({
        'rollout.routing_replay': 'behaviour'
    }, DENSE, 1, r'routing_replay=.*dense.*\'none\''),
    ({
        'loss.router_aux_coef': 0.01
    }, DENSE, 1, 'router_aux_coef=0.01 needs a mixture'),
    ({
        'mesh.expert': 2
    }, DENSE, 1, r'mesh.expert=2 needs a mixture'),
    ({
        'mesh.expert': 3
    }, MOE, 1, r'mesh.expert=3 must divide .* n_experts=8 \(valid: \[1, 2, 4, 8'),
    ({}, ModelConfig.tiny_moe(moe_impl='ragged'), 4, "moe_impl='ragged'.*'blocks' or 'dense'"),
    ({
        'lora.rank': 4
    }, MOE, 1, "lora.targets=.*valid targets: 'q', 'k', 'v', 'o'"),
])
def test_bad_moe_settings_name_the_key(updates, model, size, pattern):
  with pytest.raises(ValueError, match=pattern):
    routing.check_config(_config(**updates), model, population_size=size)


def test_good_settings_pass():
  routing.check_config(_config(**{'rollout.routing_replay': 'all', 'mesh.expert': 4}), MOE)
  routing.check_config(_config(**{'lora.rank': 4, 'lora.targets': 'q,v'}), MOE)
  routing.check_config(_config(), DENSE)


def test_replayed_experts_of_each_mode():
  experts = np.arange(2 * 5 * 1 * 2).reshape(2, 5, 1, 2)
  assert routing.replay_experts(experts, 'none', 3) is None
  np.testing.assert_array_equal(routing.replay_experts(experts, 'all', 3), experts)
  got = routing.replay_experts(experts, 'behaviour', 3)
  assert (got[:, :3] == -1).all() and (got[:, 3:] == experts[:, 3:]).all()
  assert experts.min() == 0  # the sampler's array is left as it was


def test_step_metrics_flag_flipped_real_tokens():
  sampler = jnp.array([[[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[4, 5], [6, 7]]]])  # [1, 3, 2, 2]
  trainer = jnp.array([[[[1, 0], [2, 3]], [[0, 1], [2, 4]], [[4, 0], [6, 7]]]])
  m = routing.step_metrics(sampler, trainer, jnp.array([[0.1, 1.0, 5.0]]), jnp.array([[1, 1, 0]]))
  np.testing.assert_array_equal(m['routing_flip_BT'], [[False, True, False]])
  np.testing.assert_allclose([m['routing_flip_rate'], m['routing_flip_rate_layer1']], [0.5, 0.5])
  np.testing.assert_allclose(m['routing_flip_rate_layer0'], 0.0)
  np.testing.assert_allclose(m['routing_abs_delta_share'], 1.0 / 1.1, rtol=1e-6)
