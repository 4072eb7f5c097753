"""`jtc eval` (jtc.rl.checkpoint_eval, jtc.cli.eval): a checkpoint on a dataset gives avg@k,
pass@j and the same per data source, consistent with each other (pass@1 is avg@k, a source's
share weighs its problems); bad input is one line before any compute."""
import json

import pytest

from jtc.cli import eval as eval_cli


@pytest.fixture(scope='module')
def verl_jsonl(tmp_path_factory):
  """Arithmetic problems as verl rows of two data sources (3 and 5 problems)."""
  path = tmp_path_factory.mktemp('data') / 'arith.jsonl'
  rows = [{
      'prompt': f'What is {a}+{b}?',
      'reward_model': {
          'ground_truth': str(a + b)
      },
      'data_source': 'small' if i < 3 else 'large'
  } for i, (a, b) in enumerate([(12, 13), (21, 30), (40, 11), (55, 37), (68, 29), (77,
                                                                                   16), (83,
                                                                                         14), (91,
                                                                                               8)])]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def test_eval_of_the_base_policy_per_source(verl_jsonl, tmp_path, capsys):
  out = tmp_path / 'result.json'
  assert eval_cli.main([
      '--checkpoint', 'base', '--dataset', verl_jsonl, '--config', 'configs/gspo.py', '--k', '4',
      '--config.data.reward=numeric_match', '--config.eval.batch_prompts=8', '--out',
      str(out)
  ]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result == json.loads(out.read_text()) and result['problems'] == 8
  assert result['pass@1'] == pytest.approx(result['avg@4'])
  assert result['avg@4'] <= result['pass@2'] <= result['pass@4'] <= 1
  assert result['avg@4'] == pytest.approx(
      (3 * result['small/avg@4'] + 5 * result['large/avg@4']) / 8)
