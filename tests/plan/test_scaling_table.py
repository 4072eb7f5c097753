"""`jtc.plan.scaling_table`: the table in docs/scaling.md is the one its committed plans
(docs/scaling_plans.json) give, and every real config is planned."""
import json
import os

import pytest

from jtc.plan import scaling_table


def test_the_committed_table_is_generated_from_the_committed_plans():
  with open(scaling_table.CACHE) as f:
    results = json.load(f)
  with open(scaling_table.DOC) as f:
    text = f.read()
  start, end = text.index(scaling_table.BEGIN), text.index(scaling_table.END)
  assert text[start:end + len(scaling_table.END)] == scaling_table.markdown(results)


def test_every_real_config_is_planned():
  planned = {path for path, _, _ in scaling_table.rows()}
  real = {
      os.path.join('configs', 'real', f)
      for f in os.listdir(os.path.join(scaling_table.REPO, 'configs', 'real'))
      if f.endswith('.py') and f not in ('__init__.py', 'base.py')
  }
  assert planned == real


def test_a_match_that_names_no_row_is_refused_before_any_plan(capsys):
  with pytest.raises(SystemExit):
    scaling_table.main(['0_6b', 'qwen3_70b'])
  err = capsys.readouterr().err
  assert "['qwen3_70b'] match no row" in err and 'configs/real/qwen3_0_6b_gsm8k_dfpo.py v5e-8' in err


def test_replan_replaces_only_the_matching_rows_and_records_the_revision(tmp_path, monkeypatch):
  monkeypatch.setattr(scaling_table, 'CACHE', str(tmp_path / 'plans.json'))
  monkeypatch.setattr(scaling_table, 'DOC', str(tmp_path / 'scaling.md'))
  (tmp_path / 'scaling.md').write_text('# Scaling\n')
  todo = [('configs/real/a.py', 'v5e-8', {}), ('configs/real/b.py', 'v5e-8', {})]
  monkeypatch.setattr(scaling_table, 'rows', lambda: todo)
  monkeypatch.setattr(scaling_table, 'population_rows', lambda: [])
  calls = []

  def fake_plan_row(path, slice_name, overrides, log):
    calls.append(path)
    return dict(fits=False, note=f'plan {len(calls)}')

  monkeypatch.setattr(scaling_table, 'plan_row', fake_plan_row)
  monkeypatch.setattr(scaling_table.distributed, 'code_revision', lambda **_: 'abcdef0123+dirty-x')
  scaling_table.main([])
  scaling_table.main(['a.py'])  # cached: nothing planned
  assert calls == ['configs/real/a.py', 'configs/real/b.py']
  scaling_table.main(['--replan', 'a.py'])
  with open(scaling_table.CACHE) as f:
    results = json.load(f)
  notes = {json.loads(k)[0]: r['note'] for k, r in results.items()}
  assert calls[2:] == ['configs/real/a.py']
  assert notes == {'configs/real/a.py': 'plan 3', 'configs/real/b.py': 'plan 2'}
  assert all(r['revision'] == 'abcdef0123+dirty-x' for r in results.values())
  with open(scaling_table.DOC) as f:
    assert '| plan 3 | - | - | abcdef0+ |' in f.read()


def test_replan_without_rows_named_is_refused(capsys):
  with pytest.raises(SystemExit):
    scaling_table.main(['--replan'])
  assert '--replan needs the rows to plan again named' in capsys.readouterr().err
