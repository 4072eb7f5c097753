"""Hugging Face Qwen3.5 (`Qwen3_5ForCausalLM`, a Gated DeltaNet / gated attention hybrid) against
`transformers` (torch, CPU, float32): a tiny random checkpoint written in the test loads with the
same logits on a left-padded batch, greedy decoding gives HF `generate`'s tokens, an export
round-trips exactly, and a damaged checkpoint is named; on the Qwen3-Next (with experts) the
sampler's log-probs equal the scoring pass's.

The checkpoints (tests/models/hf_hybrids.py) have their norms, gates and decay rates perturbed
away from their initialisation so that a wrongly mapped one shows up; chunks of 4 tokens make
the chunked form cross chunks.
"""
import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

transformers = pytest.importorskip('transformers')
torch = pytest.importorskip('torch')

from safetensors.numpy import load_file, save_file  # noqa: E402

from jtc.models import hf_import  # noqa: E402
from jtc.models import logprobs  # noqa: E402
from jtc.models import model as model_lib  # noqa: E402
from jtc.models import sampler  # noqa: E402
from tests.models import hf_hybrids  # noqa: E402
from tests.models import model_reference  # noqa: E402

L, F = hf_hybrids.L, hf_hybrids.F


@pytest.fixture(scope='module')
def qwen3_5(tmp_path_factory):
  """(HF model, checkpoint dir, jtc config with 4-token chunks, jtc params)."""
  directory = tmp_path_factory.mktemp('qwen3_5')
  hf_model = hf_hybrids.write_qwen3_5(directory)
  config, params = hf_import.load_hf_checkpoint(directory)
  return hf_model, directory, dataclasses.replace(config, linear_chunk=4), params


def _left_pad(prompts, width):
  return tuple(map(np.array, model_reference.padded_batch(prompts, width)))  # writable, for torch


def test_config_reads_the_hybrid(qwen3_5):
  _, _, config, params = qwen3_5
  assert config.layer_types == (L, L, F, L, F) and config.rotary_dim == 8
  assert config.attn_output_gate and config.norm_zero_centered and config.qk_norm
  assert params['layers']['attn']['q']['kernel'].shape == (2, 32, 4, 16)
  assert params['layers']['linear_attn']['v']['kernel'].shape == (3, 32, 4, 12)


def test_logits_match_transformers_on_a_left_padded_batch(qwen3_5):
  hf_model, _, config, params = qwen3_5
  rng = np.random.default_rng(0)
  tokens_BL, mask_BL = _left_pad([rng.integers(0, 96, n) for n in (13, 6, 1)], 13)
  with torch.no_grad():
    ref_BLV = hf_model(
        torch.from_numpy(tokens_BL).long(),
        attention_mask=torch.from_numpy(mask_BL).long()).logits.numpy()
  out = jax.jit(model_lib.forward, static_argnums=1)(params, config, tokens_BL,
                                                     model_lib.positions_from_mask(mask_BL),
                                                     mask_BL)
  real = mask_BL.astype(bool)
  err = np.max(np.abs(np.asarray(out.logits_BLV)[real] - ref_BLV[real]))
  assert err / np.max(np.abs(ref_BLV[real])) <= 1e-4


def test_greedy_generation_matches_transformers(qwen3_5):
  hf_model, _, config, params = qwen3_5
  rng = np.random.default_rng(2)
  P, T = 7, 20
  prompt_BP, pmask_BP = _left_pad([rng.integers(0, 96, n) for n in (7, 3, 1)], P)
  with torch.no_grad():
    ref = hf_model.generate(input_ids=torch.from_numpy(prompt_BP).long(),
                            attention_mask=torch.from_numpy(pmask_BP).long(), do_sample=False,
                            max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0)
  ref_BT = ref[:, P:].numpy()
  eos_id = int(np.setdiff1d(np.arange(config.vocab_size), ref_BT)[0])
  out = sampler.sample(params, config, prompt_BP, pmask_BP, rng=jax.random.key(0), num_samples=2,
                       max_new_tokens=T, eos_id=eos_id, pad_id=0, greedy=True)
  np.testing.assert_array_equal(out.completion_RT, np.repeat(ref_BT, 2, axis=0))


def test_export_round_trip_is_exact_and_loads_in_transformers(qwen3_5, tmp_path):
  hf_model, _, config, params = qwen3_5
  config = dataclasses.replace(config, linear_chunk=64)  # not a checkpoint field
  out_dir = hf_import.export_hf_checkpoint(config, params, tmp_path / 'export')
  config2, params2 = hf_import.load_hf_checkpoint(out_dir)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  hf2 = transformers.AutoModelForCausalLM.from_pretrained(out_dir).float()
  assert type(hf2) is type(hf_model)
  ref_sd, got_sd = hf_model.state_dict(), hf2.state_dict()
  assert set(ref_sd) == set(got_sd)
  for key, value in ref_sd.items():
    assert torch.equal(got_sd[key], value), key


def _damaged(src, dst, *, config_update=None, drop=()):
  shutil.copytree(src, dst)
  if config_update:
    hf = json.loads((dst / 'config.json').read_text())
    (dst / 'config.json').write_text(json.dumps({**hf, **config_update}))
  if drop:
    tensors = load_file(str(dst / 'model.safetensors'))
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(dst / 'model.safetensors'))
  return dst


@pytest.mark.parametrize('damage, pattern', [
    (dict(drop=('model.layers.1.linear_attn.conv1d.weight',)),
     'Missing tensor .model.layers.1.linear_attn.conv1d.weight'),
    (dict(drop=('model.layers.0.linear_attn.in_proj_a.weight',)),
     'Missing tensor .model.layers.0.linear_attn.in_proj_a.weight'),
    (dict(config_update={'layer_types': [L, L, 'sliding_attention', L, F]}),
     "layer_types .*'sliding_attention'"),
    (dict(config_update={'layer_types': [L, F]}), 'layer_types .*num_hidden_layers=5'),
])
def test_a_damaged_hybrid_checkpoint_is_named(qwen3_5, tmp_path, damage, pattern):
  _, directory, _, _ = qwen3_5
  with pytest.raises(hf_import.CheckpointError, match=pattern):
    hf_import.load_hf_checkpoint(_damaged(directory, tmp_path / 'bad', **damage))


def test_layer_types_default_from_the_full_attention_interval(qwen3_5):
  _, directory, config, _ = qwen3_5
  hf = json.loads((directory / 'config.json').read_text())
  del hf['layer_types']
  got = hf_import.config_from_hf(dict(hf, full_attention_interval=2))
  assert got.layer_types == (L, F, L, F, L)
  with pytest.raises(hf_import.CheckpointError, match='full_attention_interval=0'):
    hf_import.config_from_hf(dict(hf, full_attention_interval=0))


def test_the_text_model_of_a_vision_language_checkpoint_loads(tmp_path):
  """The published Qwen3.5 checkpoints are `Qwen3_5ForConditionalGeneration`: jtc loads its text
  model (`model.language_model.*`, the vision tower skipped) with the logits HF gives on text."""
  torch.manual_seed(1)
  text = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              initializer_range=0.1)
  vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                num_position_embeddings=16)
  hf_config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
  hf_model = transformers.Qwen3_5ForConditionalGeneration(hf_config).eval()
  with torch.no_grad():
    for key, p in hf_model.named_parameters():
      if 'norm' in key:
        p.add_(0.3 * torch.randn_like(p))
  hf_model.save_pretrained(tmp_path)
  config, params = hf_import.load_hf_checkpoint(tmp_path)
  assert config.layer_types == (L, L, L, F) and not config.tie_embeddings
  tokens_BL = np.random.default_rng(3).integers(0, 64, (2, 9))
  with torch.no_grad():
    ref_BLV = hf_model(input_ids=torch.from_numpy(tokens_BL).long()).logits.numpy()
  mask_BL = np.ones_like(tokens_BL)
  out = model_lib.forward(params, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                          mask_BL)
  assert np.max(np.abs(np.asarray(out.logits_BLV) - ref_BLV)) / np.max(np.abs(ref_BLV)) <= 1e-4


@pytest.fixture(scope='module')
def qwen3_next(tmp_path_factory):
  """A tiny Qwen3-Next (the hybrid with a mixture of experts and a shared expert in every
  layer): (HF model, jtc config with 4-token chunks, jtc params)."""
  directory = tmp_path_factory.mktemp('qwen3_next')
  hf_model = hf_hybrids.write_qwen3_next(directory)
  config, params = hf_import.load_hf_checkpoint(directory)
  return hf_model, dataclasses.replace(config, linear_chunk=4), params


@pytest.mark.slow  # two compiles of an MoE hybrid: 33 s measured on the shared 2-core CPU
def test_qwen3_next_sampler_logprobs_equal_the_scoring_pass(qwen3_next):
  """On the imported Qwen3-Next (hybrid + mixture of experts): the sampler's log-probs
  (recurrent form, one token per decode step, its own routing) equal one scoring pass's (chunked
  form, the whole sequence) to float32 round-off, at temperature 1 with G = 2 rows a prompt, so
  the mismatch instruments' negative control reads zero on it too."""
  _, config, params = qwen3_next
  tokens_BP, mask_BP = _left_pad([np.random.default_rng(6).integers(0, 96, n) for n in (7, 3)], 7)
  out = sampler.sample(params, config, tokens_BP, mask_BP, rng=jax.random.key(1), num_samples=2,
                       max_new_tokens=6, eos_id=1, pad_id=0, temperature=1.0)
  scored = logprobs.sequence_logprobs(params, config, out.tokens_RL, out.input_mask_RL,
                                      completion_start=7)
  mask = np.asarray(out.completion_mask_RT, bool)
  assert mask.sum() >= 8
  np.testing.assert_allclose(
      np.asarray(scored['logps'])[mask],
      np.asarray(out.logps_RT)[mask], rtol=1e-5, atol=1e-5)


def test_qwen3_next_matches_transformers_and_round_trips(qwen3_next, tmp_path):
  """Logits on a left-padded batch, greedy decoding (20 tokens) and the exact round trip."""
  hf_model, config, params = qwen3_next
  assert config.is_moe and config.d_shared_expert == 24 and config.layer_types == (L, L, F, L)
  rng = np.random.default_rng(5)
  tokens_BL, mask_BL = _left_pad([rng.integers(0, 96, n) for n in (9, 4)], 9)
  with torch.no_grad():
    ref_BLV = hf_model(
        torch.from_numpy(tokens_BL).long(),
        attention_mask=torch.from_numpy(mask_BL).long()).logits.numpy()
  out = model_lib.forward(params, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                          mask_BL)
  real = mask_BL.astype(bool)
  err = np.max(np.abs(np.asarray(out.logits_BLV)[real] - ref_BLV[real]))
  assert err / np.max(np.abs(ref_BLV[real])) <= 1e-4
  P, T = 9, 20
  with torch.no_grad():
    ref = hf_model.generate(input_ids=torch.from_numpy(tokens_BL).long(),
                            attention_mask=torch.from_numpy(mask_BL).long(), do_sample=False,
                            max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0)
  ref_BT = ref[:, P:].numpy()
  eos_id = int(np.setdiff1d(np.arange(config.vocab_size), ref_BT)[0])
  got = sampler.sample(params, config, tokens_BL, mask_BL, rng=jax.random.key(0), num_samples=1,
                       max_new_tokens=T, eos_id=eos_id, pad_id=0, greedy=True)
  np.testing.assert_array_equal(got.completion_RT, ref_BT)
  config = dataclasses.replace(config, linear_chunk=64)
  out_dir = hf_import.export_hf_checkpoint(config, params, tmp_path / 'export')
  config2, params2 = hf_import.load_hf_checkpoint(out_dir)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  hf2 = transformers.AutoModelForCausalLM.from_pretrained(out_dir).float()
  assert type(hf2) is type(hf_model)
  for key, value in hf_model.state_dict().items():
    assert torch.equal(hf2.state_dict()[key], value), key
