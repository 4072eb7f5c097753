"""The two silent traps of a dataset run (jtc.data.traps): verl's GSM8K prompts (which ask for
'####') with the real configs' \\boxed{} suffix, and boxed_numeric scoring GSM8K's reference
solutions as wrong, are each one warning line; the fixes (no suffix, a verifier that reads
'####') leave none; a user's function is not probed."""
import pytest

from configs.real import base
from jtc.data import rewards
from jtc.data import traps

GSM8K = [{
    'prompt': f'Tom has {a} apples. Let\'s think step by step and output the final answer after '
              '"####".',
    'answer': str(a + 1),
    'solution': f'{a}+1={a + 1}\n#### {a + 1}'
} for a in range(4)]


def data(**keys):
  c = base.get_config()
  with c.unlocked():
    c.data.update(keys)
  return c.data


def test_the_gsm8k_trap_is_two_warnings():
  lines = traps.warnings(data(), rewards.boxed_numeric, GSM8K)
  assert len(lines) == 2
  assert 'already ask for an answer format' in lines[0] and 'prompt_suffix' in lines[0]
  assert "config.data.reward='boxed_numeric' scores 4 of the first 4" in lines[1]


@pytest.mark.parametrize('reward', ['gsm8k_strict', 'numeric_match'])
def test_the_fixes_leave_no_warning(reward):
  assert traps.warnings(data(prompt_suffix='', reward=reward), rewards.get_reward_fn(reward),
                        GSM8K) == []


def test_a_dataset_without_worked_solutions_or_instructions_is_quiet():
  rows = [{'prompt': 'What is 2+2?', 'answer': '4', 'solution': '4'}]
  assert traps.warnings(data(), rewards.boxed_numeric, rows) == []


def test_a_users_function_is_not_probed():

  class Users:

    def take_metrics(self):
      return {}

    def __call__(self, *args):
      raise AssertionError('probed')

  assert len(traps.warnings(data(), Users(), GSM8K)) == 1  # the format trap only
