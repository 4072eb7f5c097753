"""`jtc tiny-checkpoint` (jtc.models.tiny_checkpoint): the directory it writes is a Hugging Face
checkpoint of the named architecture that jtc loads back as the same model, with a tokenizer
whose chat template and eos / pad tokens the real configs use; an OUT with files is refused."""
import json

import jax
import numpy as np
import pytest

from jtc.models import hf_config
from jtc.models import hf_import
from jtc.models import model as model_lib
from jtc.models import tiny_checkpoint
from jtc.models import tokenizer as tokenizer_lib


@pytest.mark.parametrize('like,arch', [('llama', 'LlamaForCausalLM'), ('qwen2', 'Qwen2ForCausalLM'),
                                       ('qwen3_5', 'Qwen3_5ForCausalLM'),
                                       ('qwen3_next', 'Qwen3NextForCausalLM')])
def test_each_architecture_is_the_one_named(like, arch):
  assert hf_config.architecture_for(tiny_checkpoint.model_config(like)) == arch
  with pytest.raises(ValueError,
                     match="valid: \\['llama', 'qwen2', 'qwen3', 'qwen3_5', 'qwen3_next'\\]"):
    tiny_checkpoint.model_config('gpt2')


@pytest.mark.parametrize('like,arch', [('qwen3', 'Qwen3ForCausalLM')])
def test_it_writes_a_checkpoint_of_the_architecture_that_loads_back(like, arch, tmp_path):
  config = tiny_checkpoint.write(str(tmp_path), like=like, seed=3)
  assert json.loads((tmp_path / 'config.json').read_text())['architectures'] == [arch]
  loaded_config, params = hf_import.load_hf_checkpoint(str(tmp_path), param_dtype='float32')
  assert (loaded_config.qk_norm, loaded_config.attn_bias) == (config.qk_norm, config.attn_bias)
  want = model_lib.init_params(config, jax.random.key(3))  # stored as bfloat16
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32), rtol=1e-2, atol=1e-2)
  tok = tokenizer_lib.HFTokenizer.from_dir(str(tmp_path))
  assert tok.decode(tok.encode('What is 1 plus 2?')) == 'What is 1 plus 2?'
  assert '<|im_start|>assistant' in tok.apply_chat_template('hi')
  assert max(tok.eos_id, tok.pad_id) < config.vocab_size
