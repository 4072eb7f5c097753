"""jtc.interop.slime: a debug rollout file written as slime's save_debug_rollout_data writes it
imports with slime's groups and GRPO advantages, and the behaviour point's GRPO coefficient
equals its closed form -A_i / (B |y_i|) (ratio 1; seq_mean_token_mean)."""
import numpy as np
import pytest
import torch

from jtc.interop import ledger_import
from jtc.interop import rollouts as rl
from jtc.interop import slime
from tests.interop import writers


def test_a_rollout_imports_with_slimes_advantages_and_the_closed_form_coefficients(tmp_path):
  samples = writers.slime_samples(writers.rng_for(1), groups=3, G=4)
  samples[5]['remove_sample'] = True  # slime trains a removed sample with an all-zero mask
  path = writers.write_slime(str(tmp_path), 12, samples)
  rollouts, source = ledger_import.read_dump('slime', path)
  columns, meta, _ = ledger_import.build(rollouts, source, objective='grpo', hparams={})
  assert meta['step'] == 12 and meta['points'] == ['behaviour'] and meta['group_size'] == 4
  want_adv = writers.slime_advantages(samples, 4)  # slime's order is the groups' here
  np.testing.assert_allclose(columns['advantages_B'], want_adv, rtol=1e-5, atol=1e-6)
  B = len(samples)
  for b, s in enumerate(samples):
    n = s['response_length']
    assert columns['completion_BT'][b, :n].tolist() == s['tokens'][-n:]
    mask = np.zeros(n) if s['remove_sample'] else np.asarray(s['loss_mask'], float)
    np.testing.assert_array_equal(columns['mask_BT'][b, :n], mask)
    np.testing.assert_allclose(columns['sampler_logps_BT'][b, :n], s['rollout_log_probs'],
                               rtol=1e-6)
    want = -want_adv[b] / (B * max(mask.sum(), 1)) * mask
    np.testing.assert_allclose(columns['coef_behaviour_BT'][b, :n], want, rtol=1e-5, atol=1e-9)
    assert columns['truncated_B'][b] == (s['status'] == 'truncated')
  # The trainer's log-probs are not in the file: unavailable (NaN), not invented.
  assert np.isnan(columns['logps_behaviour_BT'][columns['completion_mask_BT'] > 0]).all()
  assert 'mismatch_BT' not in columns


def test_a_dict_reward_needs_its_key_and_bad_fields_are_named(tmp_path):
  samples = writers.slime_samples(writers.rng_for(2), groups=2, G=2)
  for s in samples:
    s['reward'] = {'acc': s['reward'], 'format': 1.0}
  path = writers.write_slime(str(tmp_path), 3, samples)
  with pytest.raises(rl.DumpError, match=r"3.pt sample 0: field 'reward': a dict"):
    slime.read(path)
  rollouts, _ = slime.read(path, reward_key='acc')
  assert [r.reward for r in rollouts] == [s['reward']['acc'] for s in samples]
  samples[1]['loss_mask'] = samples[1]['loss_mask'] + [1]
  path = writers.write_slime(str(tmp_path), 4, samples)
  with pytest.raises(rl.DumpError, match=r"4.pt sample 1: field 'loss_mask': ragged"):
    slime.read(path, reward_key='acc')


def test_a_file_holding_arbitrary_objects_is_refused_not_unpickled(tmp_path):
  path = str(tmp_path / 'x.pt')
  torch.save({'rollout_id': 1, 'samples': [np.float64(1.0)]}, path)  # not a weights-only load
  with pytest.raises(rl.DumpError, match='torch.load\\(weights_only=True\\)'):
    slime.read(path)
