"""A checkpoint's held-out accuracy on a dataset, without training (`jtc eval`): avg@k, its
sampling error, the unbiased pass@j (`evaluation.pass_at_k`) and the same per ``data_source``.

`evaluate_checkpoint(c)` reads what a training run would read from the config ``c``: the policy
(`c.policy`: a Hugging Face directory or a jtc bundle), the held-out problems of `c.data`
(`jtc.data.selection`: ``data.eval_split`` or the dataset's ``test`` split, a held-out
``data.eval_fraction``, or its only split; a task's test split), its verifier
(`jtc.data.verifiers`), prompt encoding (`data.prompt_width`, `data.prompt_suffix`,
`data.chat_template`, `data.overlong`) and `c.eval`'s decoding (``eval.sampling``: k samples per problem, their
temperature, top-p, top-k; ``eval.problems``; ``eval.batch_prompts``). The draws are those of a
training run's evaluation at step 0 of seed ``c.seed`` (`evaluation.evaluate`).
"""
from __future__ import annotations

import sys

import jax

from jtc.data import pipeline as data_lib
from jtc.data import tasks as tasks_lib
from jtc.data import verifiers
from jtc.rl import checkpoints
from jtc.rl import evaluation
from jtc.rl import rollout as rollout_lib


def held_out(data, *, limit: int, tokenizer=None) -> tuple[str, list, list]:
  """(the split read, its first ``limit`` problems, notes) of a config's `data` section: its
  held-out rows (`selection.held_out_rows`), a dataset of one split whole, overlong prompts dropped
  or checked under ``data.overlong`` with ``tokenizer``."""
  return data_lib.held_out_examples(data, limit=limit, tokenizer=tokenizer, whole_dataset=True)


def evaluate_checkpoint(c) -> dict:
  """The evaluation of ``c.policy`` on ``c.data``'s held-out problems with ``c.eval``'s decoding:
  ``{'split', 'problems', 'avg@k', 'avg@k_se', 'pass@j', ..., '<source>/avg@k', ...}``."""
  model_config, params, tokenizer = checkpoints.load_policy(c.policy)
  task = None if c.data.dataset else tasks_lib.get_task(c.data.task)
  split, examples, notes = held_out(c.data, limit=c.eval.problems, tokenizer=tokenizer)
  for line in notes:
    print(line, file=sys.stderr)
  reward_fn = verifiers.from_config(c.data, task)
  try:
    gen = rollout_lib.Generator(model_config=model_config, tokenizer=tokenizer, reward_fn=reward_fn,
                                prompt_width=c.data.prompt_width,
                                chat_template=c.data.chat_template,
                                prompt_suffix=c.data.prompt_suffix, overlong=c.data.overlong)
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
