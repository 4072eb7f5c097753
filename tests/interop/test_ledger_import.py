"""jtc.interop.ledger_import through `jtc ledger import`: the imported step is a ledger that
`jtc ledger steps / replay / html` open; replay on it reproduces the stored coefficients; bad input
is one line naming the file, row and field (or the valid choices), nothing written."""
import json
import os

import numpy as np
import pytest

from jtc import cli
from jtc.analysis import ledger as ledger_lib
from jtc.analysis import replay as replay_lib
from tests.interop import test_neutral


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """A neutral-schema step imported by the command (grpo the run's objective, gspo replayed)."""
  tmp = tmp_path_factory.mktemp('imported')
  path = test_neutral.write(tmp / 'r.jsonl', test_neutral.neutral_rows(np.random.default_rng(5)))
  out = str(tmp / 'W')
  assert cli.main([
      'ledger', 'import', '--from', 'jsonl', path, '--out', out, '--objectives', 'grpo,gspo',
      '--hparams', 'aggregation=token_mean'
  ]) == 0
  return out


def test_the_imported_step_opens_like_a_run_of_jtcs(imported, capsys):
  assert cli.main(['ledger', 'steps', imported]) == 0
  assert capsys.readouterr().out.split() == ['4']
  ledger = ledger_lib.load(imported, 4)
  assert ledger.meta['loss'] == 'grpo' and ledger.meta['loss_hparams'] == {
      'aggregation': 'token_mean'
  } and not ledger.has_policy
  replayed = json.load(open(os.path.join(ledger.path, 'replay.json')))
  assert replayed['objectives'] == ['grpo', 'gspo']
  # Replay of the run's own objective on the stored log-probs gives the stored coefficients.
  np.testing.assert_allclose(replayed['points']['trainer']['objectives']['grpo']['coef'],
                             ledger['coef_trainer_BT'], rtol=1e-6, atol=1e-12)
  gspo = replayed['points']['trainer']['objectives']['gspo']
  assert gspo['grad_norm'] is None and replayed['points']['trainer']['cosine'] is None
  lines = replay_lib.summary_lines(ledger, ['grpo', 'gspo'], replayed['points'])
  assert any('n/a (an imported ledger without a policy' in l for l in lines)
  page = os.path.join(imported, 'view.html')
  assert cli.main(
      ['ledger', 'html', imported, '--step', '4', '--objectives', 'grpo,gspo', '--out', page]) == 0
  text = open(page).read()
  assert 'imported from jsonl' in text and 'id="colour"' in text and 'NaN' not in text


@pytest.mark.parametrize('args, message', [
    (['--from', 'trl', '{p}'], "--from 'trl' is not a format jtc reads; valid: prime-rl, slime"),
    (['--from', 'jsonl', '{p}', '--objectives', 'grpo,nope'], "unknown objective(s) ['nope']"),
    (['--from', 'jsonl', '{p}', '--objectives', 'delta'], 'needs DelTA\'s per-token weights'),
    (['--from', 'jsonl', '{p}', '--hparams', 'eps=0.1'], "unknown hyper-parameter(s) ['eps']"),
    (['--from', 'jsonl', '{d}/missing.jsonl'], 'no such file'),
    (['--from', 'jsonl', '{bad}'], "bad.jsonl:2: field 'logps': ragged: 2 values for 3 tokens"),
    (['--from', 'verl', '{p}'], 'verl dumps text; pass --tokenizer'),
    (['--from', 'slime', '{p}'], 'not a slime debug rollout file'),
    (['--from', 'prime-rl', '{p}'], "r.jsonl:1: field 'token_ids': missing"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
  rows = test_neutral.neutral_rows(np.random.default_rng(6))
  p = test_neutral.write(tmp_path / 'r.jsonl', rows)
  rows[1]['completion_ids'] = [1, 2, 3]
  rows[1]['logps'], rows[1]['old_logps'], rows[1]['mask'] = [0.1, 0.2], [0.1] * 3, [1] * 3
  rows[1]['framework_coef'] = [0.0] * 3
  bad = test_neutral.write(tmp_path / 'bad.jsonl', rows)
  out = str(tmp_path / 'W')
  argv = [a.format(p=p, d=tmp_path, bad=bad) for a in args]
  with pytest.raises(SystemExit) as e:
    cli.main(['ledger', 'import', *argv, '--out', out])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1 and 'Traceback' not in err
  assert not os.path.exists(out)


def test_an_existing_step_is_not_overwritten(imported, capsys):
  before = os.path.getmtime(os.path.join(imported, 'ledger', '4', 'ledger.npz'))
  path = ledger_lib.load(imported, 4).meta['source']['path']
  with pytest.raises(SystemExit):
    cli.main(['ledger', 'import', '--from', 'jsonl', path, '--out', imported])
  assert 'exists; pass --overwrite' in capsys.readouterr().err
  assert os.path.getmtime(os.path.join(imported, 'ledger', '4', 'ledger.npz')) == before
