"""jtc.interop.verl: a rollout_data_dir file written as verl's _dump_generations writes it (text,
balanced order) is tokenised with the run's tokenizer, grouped by prompt, given verl's GRPO
advantages, and its log-probs are recomputed from the checkpoint: equal to transformers' own."""
import numpy as np
import pytest
import torch
import transformers

from jtc.interop import ledger_import
from jtc.interop import rollouts as rl
from jtc.interop import verl
from jtc.models import tokenizer as tokenizer_lib
from tests.interop import writers

PROMPTS = ['2+3=', 'Name a colour: ', 'héllo → ']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """A tiny random Llama and the byte-level tokenizer in one HF directory."""
  path = str(tmp_path_factory.mktemp('verl_policy'))
  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=48,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, rope_theta=1000.0, initializer_range=0.2,
                                    bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                    tie_word_embeddings=False)
  config._attn_implementation = 'eager'
  model = transformers.LlamaForCausalLM(config).eval()
  model.save_pretrained(path)
  tokenizer_lib.write_byte_level_hf(path)
  return path, model


def _dump(tmp_path, G=3):
  rng = writers.rng_for(3)
  rows = [
      (p, f'{p}{i} answer {"x" * i}', float(rng.integers(0, 2))) for p in PROMPTS for i in range(G)
  ]
  order = rng.permutation(len(rows))  # verl's balanced order interleaves the groups
  rows = [rows[i] for i in order]
  path = writers.write_verl(str(tmp_path / 'rollouts'), 5, [r[0] for r in rows],
                            [r[1] for r in rows], [r[2] for r in rows],
                            {'acc': [r[2] for r in rows]})
  return path, rows


@pytest.mark.slow
def test_text_is_tokenised_grouped_and_its_log_probs_recomputed(checkpoint, tmp_path):
  ckpt, model = checkpoint
  path, rows = _dump(tmp_path)
  tok = ledger_import.load_tokenizer(ckpt)
  rollouts, source = ledger_import.read_dump('verl', path, tokenizer=tok)
  columns, meta, policy = ledger_import.build(rollouts, source, objective='grpo', hparams={},
                                              checkpoint=ckpt, tokenizer=tok)
  assert meta['step'] == 5 and meta['group_size'] == 3 and policy is not None
  where = meta['source']['where']
  want_adv = writers.verl_grpo([r[2] for r in rows], [r[0] for r in rows])
  B, P = len(rows), meta['completion_start']
  for b, w in enumerate(where):
    i = int(w.rsplit(':', 1)[1]) - 1
    prompt, output, _ = rows[i]
    group = [rows[int(x.rsplit(':', 1)[1]) - 1][0] for x in where[b // 3 * 3:b // 3 * 3 + 3]]
    assert group == [prompt] * 3  # groups: the samples of one prompt, contiguous
    p_ids, c_ids = tok.encode(prompt), tok.encode(output)
    assert columns['completion_BT'][b, :len(c_ids)].tolist() == c_ids
    assert columns['advantages_B'][b] == pytest.approx(want_adv[i], abs=1e-5)
    with torch.no_grad():
      logits = model(torch.tensor([p_ids + c_ids])).logits[0].double()
    ref = torch.log_softmax(logits,
                            -1)[len(p_ids) - 1:-1].gather(-1,
                                                          torch.tensor(c_ids)[:, None])[:,
                                                                                        0].numpy()
    np.testing.assert_allclose(columns['logps_behaviour_BT'][b, :len(c_ids)], ref, atol=2e-4)
    want = -want_adv[i] / (B * len(c_ids))
    np.testing.assert_allclose(columns['coef_behaviour_BT'][b, :len(c_ids)], want, rtol=1e-4)
  assert P == max(len(tok.encode(p)) for p in PROMPTS)


def test_without_a_checkpoint_log_probs_are_unavailable_and_coefficients_exact(
    checkpoint, tmp_path):
  path, _ = _dump(tmp_path)
  tok = ledger_import.load_tokenizer(checkpoint[0])
  rollouts, source = ledger_import.read_dump('verl', path, tokenizer=tok)
  columns, meta, policy = ledger_import.build(rollouts, source, objective='gspo', hparams={},
                                              tokenizer=tok)
  real = columns['completion_mask_BT'] > 0
  assert policy is None and meta['source']['logps'] == 'unavailable'
  assert np.isnan(columns['logps_behaviour_BT'][real]).all()
  np.testing.assert_allclose(columns['ratio_behaviour_BT'][real], 1.0)
  n = real.sum(-1)
  want = -columns['advantages_B'][:, None] / (len(n) * n[:, None]) * real
  np.testing.assert_allclose(columns['coef_behaviour_BT'], want, rtol=1e-5, atol=1e-9)


def test_verl_needs_a_tokenizer_and_names_a_bad_line(checkpoint, tmp_path):
  path, _ = _dump(tmp_path)
  with pytest.raises(ValueError, match='verl dumps text; pass --tokenizer'):
    verl.read(path, tokenizer=None)
  lines = open(path).read().splitlines()
  with open(path, 'w') as f:
    f.write('\n'.join(lines[:2] + [lines[2].replace('"score"', '"scores"')] + lines[3:]) + '\n')
  tok = ledger_import.load_tokenizer(checkpoint[0])
  with pytest.raises(rl.DumpError, match=r"5.jsonl:3: field 'score': missing"):
    verl.read(path, tokenizer=tok)
