"""A checkpoint's held-out accuracy on a dataset, without training (`jtc eval`): avg@k, its
sampling error, the unbiased pass@j (`evaluation.pass_at_k`) and the same per ``data_source``.

`evaluate_checkpoint(c)` reads what a training run would read from the config ``c``: the policy
(`c.policy`: a Hugging Face directory or a jtc bundle), the held-out problems of `c.data` (the
dataset's ``test`` split, or its only split; a task's test split), its verifier
(`jtc.data.verifiers`), prompt encoding (`data.prompt_width`, `data.prompt_suffix`,
`data.chat_template`) and `c.eval`'s decoding (``eval.sampling``: k samples per problem, their
temperature, top-p, top-k; ``eval.problems``; ``eval.batch_prompts``). The draws are those of a
training run's evaluation at step 0 of seed ``c.seed`` (`evaluation.evaluate`).
"""
from __future__ import annotations

import jax

from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.data import verifiers
from jtc.rl import checkpoints
from jtc.rl import evaluation
from jtc.rl import rollout as rollout_lib


def held_out(data, *, limit: int) -> tuple[str, list]:
  """(the split read, its first ``limit`` problems) of a config's `data` section."""
  data_dir = data.data_dir or None
  if not data.dataset:
    return 'test', data_lib.load_examples(data.task, split='test', data_dir=data_dir, limit=limit)
  path = data.eval_dataset or data.dataset
  split = data_lib.held_out_split(path)
  return split, data_lib.load_examples(path, split=split, data_dir=data_dir, limit=limit,
                                       question_field=data.question_field,
                                       answer_field=data.answer_field)


def evaluate_checkpoint(c) -> dict:
  """The evaluation of ``c.policy`` on ``c.data``'s held-out problems with ``c.eval``'s decoding:
  ``{'split', 'problems', 'avg@k', 'avg@k_se', 'pass@j', ..., '<source>/avg@k', ...}``."""
  model_config, params, tokenizer = checkpoints.load_policy(c.policy)
  task = None if c.data.dataset else tasks_lib.get_task(c.data.task)
  split, examples = held_out(c.data, limit=c.eval.problems)
  reward_fn = verifiers.from_config(c.data, task)
  try:
    gen = rollout_lib.Generator(model_config=model_config, tokenizer=tokenizer, reward_fn=reward_fn,
                                prompt_width=c.data.prompt_width,
                                chat_template=c.data.chat_template,
                                prompt_suffix=c.data.prompt_suffix)
    gen.check_prompt_width([e['prompt'] for e in examples])
    result, = evaluation.evaluate(gen, params, examples,
                                  jax.random.fold_in(jax.random.key(c.seed + 1),
                                                     0), sampling=c.eval.sampling.to_dict(),
                                  batch_prompts=c.eval.batch_prompts, task=task)
  finally:
    gen_close = getattr(reward_fn, 'close', None)
    if gen_close is not None:
      gen_close()
  result.pop('crn', None)
  return {'split': split, 'problems': len(examples), **result, **verifiers.take_metrics(reward_fn)}
