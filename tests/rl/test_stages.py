"""The stages of one RL step (`jtc.rl.stages`): which programs a config runs, their arguments
as the trainer passes them, and the state each holds meanwhile (abstract meshes, nothing
compiles)."""
import os

import jax
import jax.numpy as jnp
import pytest

from jtc.cli import absl_program
from jtc.models import lora
from jtc.rl import stages
from tests.rl import test_step


def _stages(**overrides):
  step = test_step._step(test_step._config(**overrides), fsdp=4)  # pylint: disable=protected-access
  return step, {s.name: s for s in stages.build(step, 'tpu')}


def test_a_config_runs_the_stages_its_keys_ask_for():
  _, plain = _stages(**{'eval.every': 0})
  assert list(plain) == ['prefill', 'sample', 'behaviour', 'update']
  _, every = _stages(**{
      'eval.every': 5,
      'loss.hparams.kl_coef': 0.01,
      'token_weights': 'delta',
      'loss.name': 'delta'
  })
  assert list(every) == ['prefill', 'sample', 'behaviour', 'reference', 'delta', 'update', 'eval']
  assert every['reference'].fn is every['behaviour'].fn  # one function for both passes
  assert not every['prefill'].in_total and every['sample'].in_total
  step, _ = _stages()
  assert [s.name for s in stages.build(step, 'tpu', only=('update', 'eval'))] == ['update', 'eval']


def test_calls_per_step_follow_the_chunks_the_lag_and_eval_every():
  step, s = _stages(
      **{
          'rollout.prompts_per_step': 32,
          'rollout.chunk_prompts': 8,
          'rollout.score_chunk_prompts': 4,
          'rollout.policy_lag': 1,
          'optim.minibatch_prompts': 16,
          'optim.ppo_epochs': 2,
          'eval.every': 4,
          'eval.problems': 100,
          'eval.batch_prompts': 32
      })
  assert s['sample'].calls == 4 and s['behaviour'].calls == 2 * 8  # behaviour + proximal
  assert s['update'].calls == 2 * 2 and s['eval'].calls == 4 / 4  # ceil(100 / 32) per 4 steps
  G = step.c.rollout.sampling.num_samples
  L = step.c.data.prompt_width + step.c.rollout.sampling.max_new_tokens
  assert s['behaviour'].args[1].shape == (4 * G, L)


def test_the_update_takes_the_mini_batch_and_a_lora_base_and_holds_the_step_batch():
  """The update's arguments: the state, one mini-batch of n micro-batches (the fields the
  config fills), the varied hyper-parameters and under LoRA the base; it holds meanwhile the
  whole step's batch and nothing of the state."""
  step, s = _stages(**{'lora.rank': 4, 'optim.microbatch_prompts': 2, 'rollout.correction': 'tis'})
  state, batch, hparams, frozen = s['update'].args
  assert state is step.state and isinstance(frozen, lora.Adapted) and hparams == {}
  n = step.c.optim.minibatch_prompts // 2
  assert batch.tokens_BL.shape[:2] == (n, 2 * step.c.rollout.sampling.num_samples)
  assert batch.is_weights_BT is not None and batch.ref_logps_BT is None
  assert s['update'].resident_other == pytest.approx(stages.chip_bytes(stages.step_batch(step)))
  assert isinstance(s['behaviour'].args[0], lora.Adapted)


def test_a_scoring_pass_holds_its_earlier_calls_outputs_and_their_concatenation():
  """Scoring in 4 calls holds 3 calls' log-probs and entropies (and for DelTA hidden states)
  when the last runs and then the 4 parts and their concatenation: 7 calls' outputs; one call
  holds none. Known positive: DelTA's hidden states dominate."""
  held = {}
  for chunk, delta in ((0, False), (8, False), (8, True)):
    extra = {'token_weights': 'delta', 'loss.name': 'delta'} if delta else {}
    step, s = _stages(
        **{
            'rollout.prompts_per_step': 32,
            'rollout.score_chunk_prompts': chunk,
            'rollout.chunk_prompts': chunk,
            **extra
        })
    held[chunk, delta] = s['behaviour'].resident_other - step.resident('params', 'base')
  G, T = step.c.rollout.sampling.num_samples, step.c.rollout.sampling.max_new_tokens
  one_call = 8 * G * T * 2 * 4 / 4  # logps and entropies of 8 prompts, rows over fsdp = 4
  assert held[8, False] - held[0, False] == pytest.approx(7 * one_call)
  hidden = 8 * G * T * step.model_config.d_model * 2 / 4  # bfloat16
  assert held[8, True] - held[8, False] == pytest.approx(7 * hidden)


def test_recomputed_delta_hidden_states_leave_the_behaviour_outputs_and_the_delta_arguments():
  """delta.hidden='recomputed': the behaviour pass returns no hidden states (its held outputs
  shrink by exactly them), and DelTA's pass takes the step's tokens and masks, no [B, T, D]
  array; 'held' (the known positive) passes them."""
  kw = {
      'rollout.prompts_per_step': 32,
      'rollout.score_chunk_prompts': 8,
      'token_weights': 'delta',
      'loss.name': 'delta'
  }
  held_step, held = _stages(**kw)
  step, recomputed = _stages(**kw, **{'delta.hidden': 'recomputed'})
  assert 'hidden' in stages.scoring_outputs(held_step, 8)
  assert 'hidden' not in stages.scoring_outputs(step, 8)
  G, T = step.c.rollout.sampling.num_samples, step.c.rollout.sampling.max_new_tokens
  hidden = 8 * G * T * step.model_config.d_model * 2 / 4  # bfloat16, rows over fsdp = 4
  assert (held['behaviour'].resident_other -
          recomputed['behaviour'].resident_other == pytest.approx(7 * hidden))
  ranks = lambda stage: [x.ndim for x in jax.tree.leaves(stage.args[2])]
  assert 3 in ranks(held['delta']) and 3 not in ranks(recomputed['delta'])
  inputs = recomputed['delta'].args[3]
  assert inputs['tokens_BL'].shape == (32 * G, step.c.data.prompt_width + T)
  assert step.weighter.chunk_rows == 8 * G and not step.weighter.needs_hidden


def test_chip_bytes_reads_each_shard():
  mesh = jax.sharding.AbstractMesh((1, 2, 2, 1), ('population', 'data', 'fsdp', 'tensor'))
  spec = jax.sharding.PartitionSpec(('data', 'fsdp'))
  x = jax.ShapeDtypeStruct((8, 3), 'float32', sharding=jax.sharding.NamedSharding(mesh, spec))
  assert stages.chip_bytes([x, None]) == 2 * 3 * 4
  assert stages.chip_bytes(jax.ShapeDtypeStruct((8, 3), 'int8')) == 24  # no sharding: whole


def test_a_moe_step_replays_its_experts_in_the_training_passes():
  """A MoE policy with routing replay (the 30B-A3B config, 2 layers): the behaviour pass takes
  one chunk's replayed experts [rows, L, Y, W] (int16), the update a mini-batch's, the step's
  batch holds them all, and the rollout sampler (not evaluation's) returns its routing.
  Negative: routing_replay='none' passes none."""
  c = absl_program.load_config(
      os.path.join(absl_program.REPO, 'configs/real/qwen3_30b_a3b_math_dapo.py'))
  with c.policy.overrides.ignore_type():
    c.policy.overrides.n_layers = 2
  step = test_step._step(c, fsdp=4)  # pylint: disable=protected-access
  s = {x.name: x for x in stages.build(step, 'tpu')}
  rows = c.rollout.score_chunk_prompts * c.rollout.sampling.num_samples
  L, W = c.data.prompt_width + c.rollout.sampling.max_new_tokens, step.model_config.experts_per_token
  replay = s['behaviour'].args[3]
  assert replay.shape == (rows, L, 2, W) and replay.dtype == jnp.int16
  assert s['update'].args[1].replay_BLYW.shape[2:] == (L, 2, W)
  assert stages.step_batch(step).replay_BLYW.shape == (c.rollout.prompts_per_step *
                                                       c.rollout.sampling.num_samples, L, 2, W)
  assert s['sample'].kwargs['return_routing'] and not s['eval'].kwargs['return_routing']
  with c.unlocked():
    c.rollout.routing_replay = 'none'
  s = {x.name: x for x in stages.build(test_step._step(c, fsdp=4), 'tpu')}  # pylint: disable=protected-access
  assert len(s['behaviour'].args) == 3 and s['update'].args[1].replay_BLYW is None
