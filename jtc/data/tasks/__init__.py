"""Synthetic tasks with verifiable rewards, generated locally from a seed.

``get_task(name, **kwargs)`` builds a task; each task has ``name``, ``formats``,
``examples(split, *, seed, num_examples)`` -> ``[{'prompt', 'answer', 'solutions': {fmt: text}}]``,
``reward_fn(prompts, completions, answers) -> [B] float32``, ``format_of(completion)`` and
``config()``. Train and test never share a problem (``base.split_of``).
"""
from __future__ import annotations

from jtc.data.tasks.arithmetic import ArithmeticTask
from jtc.data.tasks.base import SPLITS, Task, split_of
from jtc.data.tasks.countdown import CountdownTask
from jtc.data.tasks.phrasing import PhrasingTask

TASKS = {
    'arithmetic': ArithmeticTask,
    'countdown': CountdownTask,
    'phrasing': PhrasingTask,
}


def get_task(name: str, **kwargs) -> Task:
  """Builds the task ``name`` with its keyword knobs; unknown name -> ValueError listing TASKS."""
  if name not in TASKS:
    raise ValueError(f'unknown task {name!r}; valid: {sorted(TASKS)}')
  return TASKS[name](**kwargs)


# The task modules, then the names re-exported above.
__all__ = [
    'arithmetic', 'base', 'countdown', 'phrasing', 'ArithmeticTask', 'CountdownTask',
    'PhrasingTask', 'SPLITS', 'TASKS', 'Task', 'get_task', 'split_of'
]
