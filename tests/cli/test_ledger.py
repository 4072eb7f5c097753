"""Tests of jtc.cli.ledger (`jtc ledger`): bad input is one line naming it before anything is
written; `replay` prints its table and writes replay.json."""
import json
import os

import pytest

from jtc.cli import ledger as ledger_cli


@pytest.mark.parametrize('args, message', [
    (['replay', '{w}', '--step', '2', '--objectives', 'gspo,nope'
     ], "unknown objective(s) ['nope']"),
    (['replay', '{w}', '--step', '7', '--objectives', 'gspo'], 'steps with a ledger: [1, 2]'),
    (['replay', '{w}/missing', '--step', '1', '--objectives', 'gspo'], 'no such workdir'),
    (['html', '{w}', '--step', '1', '--objectives', 'delta', '--out', '{w}/x.html'
     ], "objective 'delta' needs per-token weights"),
    (['html', '{w}', '--step', '1', '--objectives', 'gspo', '--out', '{w}/x.html', '--group', '99'
     ], '--group 99: the step has groups 0..'),
    (['html', '{w}', '--step', '1', '--objectives', 'gspo', '--out', '{w}/config.json'
     ], 'config.json exists; pass --overwrite to replace it'),
])
def test_bad_input_is_named_and_nothing_is_written(run_with_ledger, capsys, args, message):
  before = sorted(os.listdir(os.path.join(run_with_ledger, 'ledger', '1')))
  with pytest.raises(SystemExit):
    ledger_cli.main([a.format(w=run_with_ledger) for a in args])
  assert message in capsys.readouterr().err
  assert sorted(os.listdir(os.path.join(run_with_ledger, 'ledger', '1'))) == before
  assert not os.path.exists(os.path.join(run_with_ledger, 'x.html'))


@pytest.mark.slow  # ~35 s; tests/analysis/test_replay.py keeps replay itself in CI
def test_replay_command_writes_its_table_and_file(run_with_ledger, capsys):
  assert ledger_cli.main(
      ['replay', run_with_ledger, '--step', '1', '--objectives', 'grpo,gspo,dfpo_min_replace']) == 0
  out = capsys.readouterr().out
  assert 'run objective gspo: loss' in out and 'cosine between the updates' in out
  with open(os.path.join(run_with_ledger, 'ledger', '1', 'replay.json')) as f:
    assert json.load(f)['objectives'] == ['grpo', 'gspo', 'dfpo_min_replace']


def test_steps_of_a_run_without_a_ledger_names_the_key_that_records_one(tmp_path, capsys):
  assert ledger_cli.main(['steps', str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert out.startswith('none') and '--config.log.ledger_every=N' in out
