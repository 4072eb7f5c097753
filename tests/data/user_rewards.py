"""Reward functions written as verl and TRL users write them (never imported by jtc itself): the
tests load them by name, unchanged, through `jtc.data.custom_rewards`."""
import re
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  """verl's custom_reward_function: 1.0 for the ground truth after '####', by data source."""
  if data_source == 'broken/source':
    raise ValueError('no scorer for this source')
  found = re.findall(r'#### (-?[0-9.,]+)', solution_str)
  index = (extra_info or {}).get('index', 0)
  return {'score': float(bool(found) and found[-1] == str(ground_truth)), 'index': index}


def even_length(data_source, solution_str, ground_truth, extra_info=None):
  """verl: 1.0 for a completion of even length (a random policy earns it half the time)."""
  del data_source, ground_truth, extra_info
  return float(len(solution_str) % 2 == 0)


def misbehaving(data_source, solution_str, ground_truth, extra_info=None):
  """verl, but it returns a string on 'text', None on 'none', NaN on 'nan', raises on 'raise'
  and sleeps an hour on 'hang'."""
  del data_source, ground_truth, extra_info
  if solution_str == 'hang':
    time.sleep(3600)
  if solution_str == 'raise':
    raise RuntimeError('boom')
  return {'text': 'one', 'none': None, 'nan': float('nan')}.get(solution_str, 1.0)


def reward_len(completions, **kwargs):
  """TRL's documented example: completions near 20 characters score higher."""
  del kwargs
  return [-abs(20 - len(completion)) for completion in completions]


def trl_correct(prompts, completions, answer, **kwargs):
  """TRL, standard format: the dataset's raw 'answer' column ends with '#### x'."""
  del prompts, kwargs
  return [float(a.split('####')[-1].strip() in c) for c, a in zip(completions, answer)]


def trl_chat_even(prompts, completions, **kwargs):
  """TRL, conversational format: prompts are message lists, completions one assistant message."""
  del kwargs
  assert all(isinstance(p, list) and p[-1]['role'] == 'user' for p in prompts)
  return [float(len(c[0]['content']) % 2 == 0) for c in completions]
