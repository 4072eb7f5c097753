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
from tests import test_docs_commands
from tests.interop import test_neutral
from tests.interop import test_prime_rl
from tests.interop import test_verl
from tests.interop import writers
from tests.interop.test_verl import checkpoint  # noqa: F401  (a fixture)


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


@pytest.mark.slow  # ~30 s: every format, a checkpoint's log-probs, the viewer
def test_the_docs_commands_run(tmp_path, checkpoint, capsys):
  """docs/ledger.md, "Bring another framework's rollouts": every command, on dumps written as the
  frameworks write them (RUN, DUMP, ROLLOUTS, POLICY, ROWS stand for their places)."""
  places = {
      'RUN': str(tmp_path / 'prime'),
      'DUMP': str(tmp_path / 'slime'),
      'ROLLOUTS': str(tmp_path / 'verl' / 'rollouts'),
      'POLICY': checkpoint[0],
      'ROWS.jsonl': str(tmp_path / 'rows.jsonl'),
      '/tmp/jtc/imported': str(tmp_path / 'imported')
  }
  test_prime_rl._step(tmp_path / 'prime')  # pylint: disable=protected-access
  writers.write_slime(places['DUMP'], 12, writers.slime_samples(writers.rng_for(4), groups=2, G=3))
  test_verl._dump(tmp_path / 'verl')  # pylint: disable=protected-access
  test_neutral.write(places['ROWS.jsonl'], test_neutral.neutral_rows(np.random.default_rng(7)))
  commands = test_docs_commands.section_commands('docs/ledger.md',
                                                 'Bring another framework\'s rollouts')
  assert len(commands) == 5
  for _, args in commands:
    for k, v in places.items():
      args = [a.replace(k, v) for a in args]
    assert cli.main(args) == 0, args
  assert ledger_lib.steps(places['/tmp/jtc/imported']) == [4, 5, 7, 12]
  assert os.path.exists(os.path.join(places['/tmp/jtc/imported'], 'view.html'))
  assert ledger_lib.load(places['/tmp/jtc/imported'], 5).has_policy
