"""jtc.interop.prime_rl: a two-rank step of prime-rl's token export (written as its TokenExporter
writes it) imports with its groups, and the imported coefficients equal independent ones: the
framework's from prime-rl's own loss by torch autograd, jtc's from DAPO's closed form."""
import json

import numpy as np
import pytest
import torch

from jtc.interop import ledger_import
from jtc.interop import prime_rl
from jtc.interop import rollouts as rl
from tests.interop import writers


def _step(tmp_path, *, rl_weights=False, multi_turn=False, seed=0):
  """A step of 3 groups of 4 over 2 ranks x 2 micro-batches (groups cut across ranks); returns
  (step dir, {record: (rank, micro-batch, start, end)}, grads of prime-rl's loss per rank and
  micro-batch, the micro-batches)."""
  rng = writers.rng_for(seed)
  seqs = writers.prime_sequences(rng, groups=3, G=4, multi_turn=multi_turn)
  order = rng.permutation(len(seqs))
  parts = np.array_split(order, 4)
  made = [
      writers.prime_micro_batch([seqs[i] for i in p], rng, rl_weights=rl_weights) for p in parts
  ]
  batches, outputs = [m[0] for m in made], [m[1] for m in made]
  loss = writers.prime_loss(batches, outputs)
  grads = torch.autograd.grad(loss, [o['logprobs'] for o in outputs])
  spans = {}
  for rank in (0, 1):
    mine = [2 * rank, 2 * rank + 1]
    got = writers.write_prime_export(str(tmp_path), 7, rank, [batches[i] for i in mine],
                                     [outputs[i] for i in mine])
    spans.update({k: (mine[mb], s, e) for k, (mb, s, e) in got.items()})
  return str(tmp_path / 'token_exports' / 'step_7'), spans, grads, batches


def _imported(step_dir, objective='dapo'):
  rollouts, source = ledger_import.read_dump('prime-rl', step_dir)
  return ledger_import.build(rollouts, source, objective=objective, hparams={})


@pytest.mark.parametrize('rl_weights, multi_turn', [(False, False), (True, True)])
def test_a_two_rank_step_imports_with_prime_rls_own_gradient_beside_jtcs(
    tmp_path, rl_weights, multi_turn):
  step_dir, spans, grads, batches = _step(tmp_path, rl_weights=rl_weights, multi_turn=multi_turn)
  columns, meta, _ = _imported(step_dir)
  G = meta['group_size']
  assert meta['step'] == 7 and meta['points'] == ['trainer'] and G == 4
  where = meta['source']['where']
  assert sorted(w for w in where if w) == sorted(spans)  # every record, each once
  P = meta['completion_start']
  mask = columns['mask_BT']
  n_tokens = mask.sum()
  for b, w in enumerate(where):
    mb, start, end = spans[w]
    ids = batches[mb]['input_ids'][0, start:end].tolist()
    lm = batches[mb]['loss_mask'][0, start:end].tolist()
    first = lm.index(True)
    prompt = columns['prompt_BP'][b][columns['prompt_mask_BP'][b] > 0].tolist()
    assert prompt == ids[:first]  # the prompt is what precedes the first loss token
    n = end - start - first
    assert columns['completion_BT'][b, :n].tolist() == ids[first:]
    # prime-rl's per-token gradient (autograd of its loss) is the framework coefficient.
    np.testing.assert_allclose(columns['framework_coef_BT'][b, :n],
                               grads[mb][0, start + first:end].numpy(), rtol=2e-5, atol=1e-9)
    # jtc's DAPO coefficient, independently: -A r / N inside the clip, 0 where it clips.
    tl = batches[mb]['inference_logprobs'][0, start + first:end].numpy()
    r = np.exp(columns['logps_trainer_BT'][b, :n].astype(np.float64) - tl)
    a = columns['advantages_B'][b]
    clipped = ((a > 0) & (r > 1.28)) | ((a < 0) & (r < 0.8))
    want = np.where(clipped, 0.0, -a * r / n_tokens) * mask[b, :n]
    np.testing.assert_allclose(columns['coef_trainer_BT'][b, :n], want, rtol=1e-5, atol=1e-9)
  # Groups: G contiguous rows sharing their prompt.
  for g in range(len(where) // G):
    prompts = {tuple(columns['prompt_BP'][b]) for b in range(g * G, g * G + G)}
    assert len(prompts) == 1
  assert np.isnan(columns['rewards_B']).all()  # not exported: unavailable, not invented


def test_framework_hyper_parameters_scale_the_kl_term(tmp_path):
  step_dir, *_ = _step(tmp_path)
  base, _ = prime_rl.read(step_dir)
  no_kl, _ = prime_rl.read(step_dir, framework_hparams={'kl_tau': 0.0})
  a = np.concatenate([r.framework['coef'] for r in base])
  b = np.concatenate([r.framework['coef'] for r in no_kl])
  assert np.abs(a - b).max() > 0  # the KL term is there and kl_tau reaches it
  with pytest.raises(ValueError, match="unknown prime-rl hyper-parameter 'tau'"):
    prime_rl.read(step_dir, framework_hparams={'tau': 1})


def test_bad_records_are_named_by_file_line_and_field(tmp_path):
  step_dir, *_ = _step(tmp_path)
  path = f'{step_dir}/rank_1.jsonl'
  lines = open(path).read().splitlines()
  record = json.loads(lines[1])
  record['trainer_logprobs'] = record['trainer_logprobs'][:-1]
  with open(path, 'w') as f:
    f.write('\n'.join([lines[0], json.dumps(record)] + lines[2:]) + '\n')
  with pytest.raises(rl.DumpError, match=rf"rank_1.jsonl:2: field 'trainer_logprobs': ragged"):
    prime_rl.read(step_dir)
  del record['advantages']
  with open(path, 'w') as f:
    f.write(json.dumps(record) + '\n')
  with pytest.raises(rl.DumpError, match=r"rank_1.jsonl:1: field 'advantages': missing"):
    prime_rl.read(path)
  with pytest.raises(rl.DumpError, match='no rank_<rank>.jsonl'):
    prime_rl.read(str(tmp_path))
