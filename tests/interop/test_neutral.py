"""jtc.interop.neutral: the documented per-token schema imports at the trainer point with its
framework coefficient, its GRPO coefficients equal the closed form, and malformed rows are named
by line and field."""
import json

import numpy as np
import pytest

from jtc.interop import ledger_import
from jtc.interop import neutral
from jtc.interop import rollouts as rl


def neutral_rows(rng, *, groups=2, G=3, step=4, logps=True):
  """Rows of the schema: groups of G, log-probs off-policy, a framework coefficient."""
  rows = []
  for g in range(groups):
    prompt = rng.integers(1, 40, 3).tolist()
    for i in range(G):
      n = int(rng.integers(1, 6))
      old = rng.uniform(-2, -0.1, n)
      row = {
          'group': f'q{g}',
          'step': step,
          'prompt_ids': prompt,
          'completion_ids': rng.integers(1, 40, n).tolist(),
          'reward': float(i == 0),
          'mask': [1] * n,
          'framework_coef': rng.normal(0, 0.01, n).tolist(),
          'completion_text': f'c{g}{i}'
      }
      if logps:
        row.update(old_logps=old.tolist(), logps=(old + rng.normal(0, 0.1, n)).tolist())
      rows.append(row)
  return rows


def write(path, rows):
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def test_the_schema_imports_with_the_closed_form_grpo_coefficients(tmp_path):
  rows = neutral_rows(np.random.default_rng(0))
  path = write(tmp_path / 'r.jsonl', rows)
  rollouts, source = ledger_import.read_dump('jsonl', path)
  columns, meta, _ = ledger_import.build(rollouts, source, objective='grpo', hparams={})
  assert meta['points'] == ['trainer'] and meta['step'] == 4 and meta['group_size'] == 3
  B = len(rows)
  for b, r in enumerate(rows):
    n = len(r['completion_ids'])
    rewards = np.array([x['reward'] for x in rows[b // 3 * 3:b // 3 * 3 + 3]])
    a = (r['reward'] - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
    assert columns['advantages_B'][b] == pytest.approx(a, rel=1e-5)
    ratio = np.exp(np.array(r['logps']) - np.array(r['old_logps']))
    clipped = ((a > 0) & (ratio > 1.2)) | ((a < 0) & (ratio < 0.8))
    want = np.where(clipped, 0.0, -a * ratio / (B * n))
    np.testing.assert_allclose(columns['coef_trainer_BT'][b, :n], want, rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(columns['framework_coef_BT'][b, :n], r['framework_coef'], rtol=1e-6)


def test_unequal_groups_are_padded_and_named(tmp_path):
  rows = neutral_rows(np.random.default_rng(1), logps=False)
  del rows[4]
  rollouts, source = ledger_import.read_dump('jsonl', write(tmp_path / 'r.jsonl', rows))
  columns, meta, _ = ledger_import.build(rollouts, source, objective='gspo', hparams={})
  assert meta['source']['padded_rows'] == [5] and meta['points'] == ['behaviour']
  assert not columns['completion_mask_BT'][5].any() and (columns['coef_behaviour_BT'][5] == 0).all()
  assert 'empty rows pad' in ledger_import.summary(meta, columns)


@pytest.mark.parametrize('edit, message', [
    (lambda r: r.update(mask=r['mask'] + [1]), r"r.jsonl:2: field 'mask': ragged: "),
    (lambda r: r.pop('prompt_ids'), r"r.jsonl:2: field 'prompt_ids': missing"),
    (lambda r: r.pop('old_logps'), r"r.jsonl:2: field 'old_logps': missing"),
    (lambda r: r.update(completion_ids=[1, -2]), r"r.jsonl:2: field 'completion_ids': -2 is not"),
    (lambda r: r.update(reward=None), r"r.jsonl:\d: field 'reward': missing"),
])
def test_a_bad_row_is_named_by_line_and_field(tmp_path, edit, message):
  rows = neutral_rows(np.random.default_rng(2))
  edit(rows[1])
  with pytest.raises(rl.DumpError, match=message):
    neutral.read(write(tmp_path / 'r.jsonl', rows))


def test_a_file_of_several_steps_needs_step(tmp_path):
  rows = neutral_rows(np.random.default_rng(3)) + neutral_rows(np.random.default_rng(4), step=5)
  path = write(tmp_path / 'r.jsonl', rows)
  with pytest.raises(ValueError, match=r'holds steps \[4, 5\]; pass --step'):
    neutral.read(path)
  assert {r.step for r in neutral.read(path, step=5)[0]} == {5}
