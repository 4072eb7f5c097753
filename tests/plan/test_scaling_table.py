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
