"""Tests of jtc.cli.plot (`jtc plot`): runs (a population's workdir standing for its members) to a
PNG, and a key no run logs is an error naming the keys they have, with nothing written."""
import json
import os

import pytest

from jtc.analysis import metric_writer
from jtc.cli import plot

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _run(workdir, lift):
  writer = metric_writer.MetricWriter(str(workdir))
  for step in range(0, 21):
    writer.write(step, {
        'reward_mean': 0.4 + lift * step,
        **({
            'eval/avg@4': 0.5
        } if step % 10 == 0 else {})
    })
  writer.close()
  return str(workdir)


def test_runs_and_a_populations_members_are_drawn(tmp_path, capsys):
  single = _run(tmp_path / 'single', 0.01)
  for index in (0, 1):  # a population of two members
    member = tmp_path / 'pop' / 'members' / f'seed{index}'
    _run(member, 0.02 * index)
    with open(member / 'member.json', 'w') as f:
      json.dump({'index': index}, f)
  out = str(tmp_path / 'curves.png')
  assert plot.main([single, str(tmp_path / 'pop'), '--out', out, '--smooth', '3']) == 0
  assert capsys.readouterr().out.split() == [out]
  with open(out, 'rb') as f:
    assert f.read(8) == PNG_MAGIC


def test_a_key_no_run_logs_is_named_and_nothing_is_written(tmp_path, capsys):
  run = _run(tmp_path / 'a', 0.01)
  with pytest.raises(SystemExit) as exit_info:
    plot.main([run, '--out', str(tmp_path / 'b.png'), '--keys', 'reward_mean,nope'])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "unknown metric keys ['nope']" in err and "'reward_mean'" in err
  assert not os.path.exists(tmp_path / 'b.png')
