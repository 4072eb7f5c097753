"""Hugging Face import/export against `transformers` (torch, CPU, float32) as the reference.

For each architecture a tiny random model is built once per module with `transformers`,
saved with `save_pretrained`, and loaded with `jtc.models.hf_import`. Norm scales and biases are
perturbed away from their 1/0 initialisation so that a wrongly mapped norm or bias shows up."""
import dataclasses
import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip('transformers')
torch = pytest.importorskip('torch')

from safetensors.numpy import load_file, save_file  # noqa: E402

from jtc.models import hf_import  # noqa: E402
from jtc.models import model as model_lib  # noqa: E402
from jtc.models import logprobs
from jtc.models import sampler  # noqa: E402
from tests.models import model_reference  # noqa: E402

_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0,
               initializer_range=0.1, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None,
               pad_token_id=None)

# name -> (config class, model class, extra config, max_shard_size or None)
ARCHS = {
    'llama_untied_sharded':
        ('LlamaConfig', 'LlamaForCausalLM', dict(tie_word_embeddings=False), '40KB'),
    'qwen2_untied': ('Qwen2Config', 'Qwen2ForCausalLM', dict(tie_word_embeddings=False), None),
    # head_dim != hidden / heads, as in the real Qwen3 models.
    'qwen3_tied': ('Qwen3Config', 'Qwen3ForCausalLM', dict(tie_word_embeddings=True,
                                                           head_dim=24), None),
    'qwen3_moe_untied': ('Qwen3MoeConfig', 'Qwen3MoeForCausalLM',
                         dict(tie_word_embeddings=False, head_dim=24, num_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True), None),
    'qwen2_moe_tied_shared': ('Qwen2MoeConfig', 'Qwen2MoeForCausalLM',
                              dict(tie_word_embeddings=True, num_experts=4, num_experts_per_tok=3,
                                   moe_intermediate_size=32, shared_expert_intermediate_size=40,
                                   norm_topk_prob=False), None),
}


def _build_hf(name, directory, dtype=torch.float32):
  config_cls, model_cls, extra, shard = ARCHS[name]
  torch.manual_seed(sum(map(ord, name)))
  hf_config = getattr(transformers, config_cls)(**_COMMON, **extra)
  hf_config._attn_implementation = 'eager'
  hf_model = getattr(transformers, model_cls)(hf_config).eval()
  with torch.no_grad():
    for key, p in hf_model.named_parameters():
      if 'norm' in key:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif key.endswith('bias'):
        p.copy_(0.3 * torch.randn_like(p))
  hf_model = hf_model.to(dtype)
  kwargs = {} if shard is None else dict(max_shard_size=shard)
  hf_model.save_pretrained(directory, **kwargs)
  return hf_model


@pytest.fixture(scope='module', params=list(ARCHS))
def loaded(request, tmp_path_factory):
  """(name, HF model, checkpoint dir, jtc config, jtc params) for one architecture."""
  directory = tmp_path_factory.mktemp(request.param)
  hf_model = _build_hf(request.param, directory)
  config, params = hf_import.load_hf_checkpoint(directory)
  return request.param, hf_model, directory, config, params


def _rel_err(x, ref):
  return float(np.max(np.abs(np.asarray(x) - ref)) / np.max(np.abs(ref)))


def _left_pad(prompts, width):
  return tuple(map(np.array, model_reference.padded_batch(prompts, width)))  # writable, for torch


# ----------------------------------------------------------------------------------------
# Loading.


def test_checkpoint_layout_is_what_the_test_claims(loaded):
  name, _, directory, config, params = loaded
  files = sorted(p.name for p in directory.glob('*.safetensors'))
  if ARCHS[name][3] is not None:
    assert (directory / hf_import.INDEX_FILE).exists() and len(files) > 1, files
  else:
    assert files == ['model.safetensors']
  assert config.tie_embeddings == ('lm_head' not in params)
  assert config.attn_bias == name.startswith('qwen2')
  assert config.qk_norm == name.startswith('qwen3')
  assert config.is_moe == ('moe' in name) and (config.d_shared_expert > 0) == ('shared' in name)
  # Same tree structure and shapes as a freshly initialised jtc model of that config.
  fresh = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.PRNGKey(0)))
  assert (jax.tree_util.tree_map(lambda x: (x.shape, x.dtype),
                                 params) == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype),
                                                                   fresh))


def test_logits_match_transformers(loaded):
  _, hf_model, _, config, params = loaded
  tokens_BL = np.random.default_rng(0).integers(0, config.vocab_size, (2, 11), dtype=np.int32)
  with torch.no_grad():
    ref_BLV = hf_model(torch.from_numpy(tokens_BL).long()).logits.numpy()
  mask_BL = jnp.ones_like(tokens_BL)
  out = jax.jit(model_lib.forward, static_argnums=1)(params, config, tokens_BL,
                                                     model_lib.positions_from_mask(mask_BL),
                                                     mask_BL)
  assert out.logits_BLV.dtype == jnp.float32
  assert _rel_err(out.logits_BLV, ref_BLV) <= 1e-4


def test_logits_and_logprobs_match_transformers_with_left_padding(loaded):
  _, hf_model, _, config, params = loaded
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, config.vocab_size, n) for n in (5, 2)]
  P, T = 5, 4
  prompt_BP, pmask_BP = _left_pad(prompts, P)
  completion_BT = rng.integers(0, config.vocab_size, (2, T)).astype(np.int32)
  tokens_BL = np.concatenate([prompt_BP, completion_BT], 1)
  mask_BL = np.concatenate([pmask_BP, np.ones_like(completion_BT)], 1)
  out = logprobs.sequence_logprobs(params, config, tokens_BL, mask_BL, completion_start=P)
  logits_BLV = model_lib.forward(params, config, tokens_BL, model_lib.positions_from_mask(mask_BL),
                                 mask_BL).logits_BLV
  for b, prompt in enumerate(prompts):  # the reference sees each sequence unpadded
    seq = np.concatenate([prompt, completion_BT[b]])
    with torch.no_grad():
      logits = hf_model(torch.from_numpy(seq)[None].long()).logits[0].double()
    assert _rel_err(logits_BLV[b, P - len(prompt):], logits.numpy()) <= 1e-4
    logp = torch.log_softmax(logits, -1).numpy()
    ref_T = logp[np.arange(len(prompt) - 1, len(seq) - 1), completion_BT[b]]
    np.testing.assert_allclose(out['logps'][b], ref_T, rtol=1e-4, atol=1e-4)


def test_greedy_generation_matches_transformers(loaded):
  _, hf_model, _, config, params = loaded
  rng = np.random.default_rng(2)
  prompts = [rng.integers(0, config.vocab_size, n) for n in (6, 3, 1)]
  P, T = 6, 20
  prompt_BP, pmask_BP = _left_pad(prompts, P)
  with torch.no_grad():
    ref = hf_model.generate(input_ids=torch.from_numpy(prompt_BP).long(),
                            attention_mask=torch.from_numpy(pmask_BP).long(), do_sample=False,
                            max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0)
  ref_BT = ref[:, P:].numpy()
  assert ref_BT.shape == (3, T)
  # An EOS id that the reference never emits, so neither side stops early.
  eos_id = int(np.setdiff1d(np.arange(config.vocab_size), ref_BT)[0])
  out = sampler.sample(params, config, prompt_BP, pmask_BP, rng=jax.random.PRNGKey(0),
                       num_samples=2, max_new_tokens=T, eos_id=eos_id, pad_id=0, greedy=True)
  np.testing.assert_array_equal(out.completion_RT, np.repeat(ref_BT, 2, axis=0))
  assert np.all(np.asarray(out.completion_mask_RT) == 1)


# ----------------------------------------------------------------------------------------
# RoPE scaling: Llama-3.1/3.2 "llama3" and "linear", against transformers.

ROPE_SCALINGS = {
    # Frequencies in all three llama3 regimes at head_dim 16, theta 1e4: wavelengths
    # 6.3 .. 19,869 against the thresholds 256 / 4 = 64 and 256 / 1 = 256.
    'llama3':
        dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
             original_max_position_embeddings=256),
    'linear':
        dict(rope_type='linear', factor=3.0),
}


@pytest.fixture(scope='module', params=sorted(ROPE_SCALINGS))
def rope_scaled(request, tmp_path_factory):
  """A tiny Llama with RoPE scaling, saved by transformers (which writes rope_parameters)."""
  torch.manual_seed(7)
  hf_config = transformers.LlamaConfig(**{
      **_COMMON, 'rope_theta': 1e4
  }, head_dim=16, tie_word_embeddings=False, max_position_embeddings=4096,
                                       rope_scaling=dict(ROPE_SCALINGS[request.param]))
  hf_config._attn_implementation = 'eager'
  hf_model = transformers.LlamaForCausalLM(hf_config).eval()
  directory = tmp_path_factory.mktemp(f'rope_{request.param}')
  hf_model.save_pretrained(directory)
  return request.param, hf_model, directory


def test_rope_scaling_logits_and_greedy_generation_match_transformers(rope_scaled):
  name, hf_model, directory = rope_scaled
  config, params = hf_import.load_hf_checkpoint(directory)
  assert config.rope_scaling == name and config.rope_factor == ROPE_SCALINGS[name]['factor']
  # Positions far apart: the scaled frequencies matter at every one of them.
  tokens_BL = np.random.default_rng(4).integers(0, config.vocab_size, (2, 40), dtype=np.int32)
  with torch.no_grad():
    ref_BLV = hf_model(torch.from_numpy(tokens_BL).long()).logits.numpy()
  mask_BL = jnp.ones_like(tokens_BL)
  out = jax.jit(model_lib.forward, static_argnums=1)(params, config, tokens_BL,
                                                     model_lib.positions_from_mask(mask_BL),
                                                     mask_BL)
  assert _rel_err(out.logits_BLV, ref_BLV) <= 1e-4
  plain = jax.jit(model_lib.forward,
                  static_argnums=1)(params, dataclasses.replace(config, rope_scaling='default'),
                                    tokens_BL, model_lib.positions_from_mask(mask_BL), mask_BL)
  assert _rel_err(plain.logits_BLV, ref_BLV) > 1e-3  # plain RoPE would not have matched
  prompts = [np.arange(1, 9), np.arange(3, 6)]
  P, T = 8, 8
  prompt_BP, pmask_BP = _left_pad(prompts, P)
  with torch.no_grad():
    ref = hf_model.generate(input_ids=torch.from_numpy(prompt_BP).long(),
                            attention_mask=torch.from_numpy(pmask_BP).long(), do_sample=False,
                            max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0)
  ref_BT = ref[:, P:].numpy()
  eos_id = int(np.setdiff1d(np.arange(config.vocab_size), ref_BT)[0])
  got = sampler.sample(params, config, prompt_BP, pmask_BP, rng=jax.random.PRNGKey(0),
                       num_samples=1, max_new_tokens=T, eos_id=eos_id, pad_id=0, greedy=True)
  np.testing.assert_array_equal(got.completion_RT, ref_BT)


def test_rope_scaling_reads_both_spellings_and_exports_them(rope_scaled, tmp_path):
  """transformers 4 wrote rope_theta + rope_scaling, transformers 5 writes rope_parameters;
  both load to the same config, and the export (rope_scaling) loads back in both libraries."""
  name, _, directory = rope_scaled
  config, params = hf_import.load_hf_checkpoint(directory)
  hf = json.loads((directory / 'config.json').read_text())
  assert 'rope_parameters' in hf
  old_style = {k: v for k, v in hf.items() if k != 'rope_parameters'}
  old_style['rope_theta'] = hf['rope_parameters']['rope_theta']
  old_style['rope_scaling'] = {k: v for k, v in hf['rope_parameters'].items() if k != 'rope_theta'}
  assert hf_import.config_from_hf(old_style) == config
  both = dict(old_style, rope_parameters=hf['rope_parameters'])
  assert hf_import.config_from_hf(both) == config  # both present and agreeing: fine
  out = hf_import.export_hf_checkpoint(config, params, tmp_path / 'export')
  assert hf_import.load_hf_checkpoint(out)[0] == config
  again = transformers.AutoConfig.from_pretrained(out)
  assert again.rope_parameters['rope_type'] == name
  assert again.rope_parameters['factor'] == ROPE_SCALINGS[name]['factor']


# ----------------------------------------------------------------------------------------
# Export and dtypes.


def test_export_round_trip_is_exact_and_loads_in_transformers(loaded, tmp_path):
  _, hf_model, _, config, params = loaded
  out_dir = hf_import.export_hf_checkpoint(config, params, tmp_path / 'export')
  config2, params2 = hf_import.load_hf_checkpoint(out_dir)
  assert config2 == config
  jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
  # transformers reads the export back into exactly the original torch weights.
  hf2 = transformers.AutoModelForCausalLM.from_pretrained(out_dir).float()
  assert type(hf2) is type(hf_model)
  ref_sd, got_sd = hf_model.state_dict(), hf2.state_dict()
  assert set(ref_sd) == set(got_sd)
  for key, value in ref_sd.items():
    assert torch.equal(got_sd[key], value), key


def test_bfloat16_checkpoint_loads_bit_exact(tmp_path):
  hf_model = _build_hf('qwen3_tied', tmp_path, dtype=torch.bfloat16)
  config, params = hf_import.load_hf_checkpoint(tmp_path)
  assert config.param_dtype == 'bfloat16' and config.dtype == 'bfloat16'
  ref = hf_model.model.layers[1].self_attn.k_proj.weight.detach().float().numpy()  # [K*H, D]
  got = params['layers']['attn']['k']['kernel'][1]  # [D, K, H] of layer 1
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32).reshape(config.d_model, -1).T, ref)
  # Upcasting on load is exact; compute dtype can differ from the param dtype.
  config32, params32 = hf_import.load_hf_checkpoint(tmp_path, param_dtype='float32')
  assert config32.param_dtype == 'float32' and config32.dtype == 'float32'
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.float32(a), b), params,
                         params32)


# ----------------------------------------------------------------------------------------
# Bad input: each error names the file and the key.


def _export_random(config, directory):
  shapes = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.PRNGKey(1)))
  rng = np.random.default_rng(1)
  params = jax.tree_util.tree_map(lambda x: rng.normal(size=x.shape).astype(np.float32), shapes)
  return hf_import.export_hf_checkpoint(config, params, directory)


@pytest.fixture(scope='module')
def llama_dir(tmp_path_factory):
  """A single-file tiny Llama checkpoint (exported by jtc) to corrupt in the tests below."""
  return _export_random(
      model_lib.ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
                            head_dim=8, d_ff=24, tie_embeddings=False),
      tmp_path_factory.mktemp('llama'))


def _corrupt(src, dst, *, config_update=None, tensors_update=None, drop=()):
  shutil.copytree(src, dst)
  if config_update is not None:
    cfg = json.loads((dst / 'config.json').read_text())
    cfg.update(config_update)
    (dst / 'config.json').write_text(json.dumps(cfg))
  if tensors_update is not None or drop:
    tensors = load_file(str(dst / 'model.safetensors'))
    tensors.update(tensors_update or {})
    for key in drop:
      del tensors[key]
    save_file(tensors, str(dst / 'model.safetensors'), metadata={'format': 'pt'})
  return dst


KEY = 'model.layers.1.mlp.up_proj.weight'  # [F, D] = [24, 16]
EXPERT = 'model.layers.1.mlp.experts.3.up_proj.weight'  # [F, D] = [8, 16] of a tiny Qwen3-MoE


@pytest.mark.parametrize('corruption, patterns', [
    (dict(config_update=dict(architectures=['GPT2LMHeadModel'])), [
        'GPT2LMHeadModel', 'config.json', 'LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'
    ]),
    (dict(config_update=dict(rope_scaling=dict(rope_type='yarn', factor=8.0))),
     ['yarn', 'config.json', 'default', 'linear', 'llama3']),
    (dict(config_update=dict(rope_scaling=dict(rope_type='llama3', factor=8.0))),
     ['llama3', 'low_freq_factor', 'config.json']),
    (dict(config_update=dict(rope_scaling=dict(rope_type='linear', factor=2.0),
                             rope_parameters=dict(rope_type='default', rope_theta=1e4))),
     ['rope_parameters', 'rope_scaling', 'disagree']),
    (dict(config_update=dict(rope_theta=1e4, rope_parameters=dict(
        rope_type='default', rope_theta=5e5))), ['rope_theta', '10000', '500000']),
    (dict(config_update=dict(attention_bias=True)), ['attention_bias', 'config.json']),
    (dict(drop=[KEY]), ['Missing tensor', KEY]),
    (dict(tensors_update={KEY: np.zeros((16, 24), np.float32)}),
     [KEY, 'model.safetensors', r'\[16, 24\]', r'expected \[24, 16\]']),
    (dict(tensors_update={KEY: np.zeros((24, 16), np.float16)}),
     ['dtype mismatch', KEY, 'model.safetensors', 'F16', 'F32']),
    (dict(tensors_update={KEY: np.zeros((24, 16), np.int32)}),
     ['Unsupported dtype', 'I32', KEY, 'model.safetensors']),
    (dict(tensors_update={'model.layers.0.self_attn.o_proj.bias': np.zeros(16, np.float32)}),
     ['Unexpected', 'o_proj.bias', 'model.safetensors']),
])
def test_bad_checkpoint_raises_clear_error(llama_dir, tmp_path, corruption, patterns):
  bad = _corrupt(llama_dir, tmp_path / 'bad', **corruption)
  with pytest.raises(hf_import.CheckpointError) as info:
    hf_import.load_hf_checkpoint(bad)
  for pattern in patterns:
    assert re.search(pattern, str(info.value)), (pattern, info.value)


def test_truncated_safetensors_names_file_and_tensor(llama_dir, tmp_path):
  bad = _corrupt(llama_dir, tmp_path / 'cut')
  file = bad / 'model.safetensors'
  entries = hf_import.read_safetensors_header(file)
  last = max(entries, key=lambda k: entries[k].end)
  with open(file, 'r+b') as f:
    f.truncate(entries[last].end - 3)
  with pytest.raises(hf_import.CheckpointError) as info:
    hf_import.load_hf_checkpoint(bad)
  for pattern in ('model.safetensors', re.escape(last), 'truncated'):
    assert re.search(pattern, str(info.value)), (pattern, info.value)


def test_strict_dtype_false_casts_mixed_checkpoint(llama_dir, tmp_path):
  up = load_file(str(llama_dir / 'model.safetensors'))[KEY]
  bad = _corrupt(llama_dir, tmp_path / 'mixed', tensors_update={KEY: up.astype(np.float16)})
  config, params = hf_import.load_hf_checkpoint(bad, strict_dtype=False)
  np.testing.assert_array_equal(params['layers']['mlp']['up']['kernel'][1],
                                up.astype(np.float16).astype(np.float32).T)
  assert config.param_dtype == 'float32'


def test_missing_shard_and_missing_config(llama_dir, tmp_path):
  bad = _corrupt(llama_dir, tmp_path / 'shard')
  tensors = load_file(str(bad / 'model.safetensors'))
  index = {'metadata': {}, 'weight_map': {k: 'model-00001-of-00002.safetensors' for k in tensors}}
  (bad / 'model.safetensors.index.json').write_text(json.dumps(index))
  with pytest.raises(hf_import.CheckpointError, match='model-00001-of-00002.safetensors'):
    hf_import.load_hf_checkpoint(bad)
  (bad / 'config.json').unlink()
  with pytest.raises(FileNotFoundError, match='config.json'):
    hf_import.load_hf_checkpoint(bad)


def test_export_rejects_incomplete_params(llama_dir, tmp_path):
  config, params = hf_import.load_hf_checkpoint(llama_dir)
  del params['lm_head']
  with pytest.raises(ValueError, match='lm_head'):
    hf_import.export_hf_checkpoint(config, params, tmp_path / 'out')


@pytest.mark.parametrize('corruption, patterns', [
    (dict(drop=[EXPERT]), ['Missing tensor', re.escape(EXPERT)]),
    (dict(tensors_update={EXPERT: np.zeros((16, 8), np.float32)}),
     [re.escape(EXPERT), 'model.safetensors', r'expected \[8, 16\]']),
    (dict(tensors_update={EXPERT[:-16] + '4.up_proj.weight': np.zeros((8, 16), np.float32)}),
     ['Unexpected', 'experts.4.up_proj']),
])
def test_bad_moe_checkpoint_raises_clear_error(tmp_path, corruption, patterns):
  config = model_lib.ModelConfig.tiny_moe(32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
                                          head_dim=8, n_experts=4, d_expert=8, qk_norm=True)
  test_bad_checkpoint_raises_clear_error(_export_random(config, tmp_path / 'moe'), tmp_path,
                                         corruption, patterns)
