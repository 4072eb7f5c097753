"""verl's rollout dump (``trainer.rollout_data_dir``) as `Rollout` records: text, tokenised here.

verl's trainer writes, after the actor update of each step (``RayPPOTrainer._log_rollout_data``
and ``_dump_generations`` in ``verl/trainer/ppo/ray_trainer.py``), ``<rollout_data_dir>/
<global_step>.jsonl``: one ``json.dumps(entry, ensure_ascii=False)`` line per sample with
``input`` (the prompt ids decoded with ``skip_special_tokens=True``), ``output`` (the response,
decoded the same way), ``gts`` (the ground truth, or null), ``score`` (the sum of the token-level
scores: the reward), ``step``, and every per-sample list of the reward function's extra infos
(e.g. ``acc``, ``pred``). Lines are joined with newlines and the file ends with one. No token
ids, log-probs, advantages or group ids are dumped, and the batch order is verl's balanced order,
not the groups'.

What jtc reads: prompt and completion are tokenised with the run's tokenizer (``--tokenizer`` or
the ``--policy.checkpoint`` directory's), without special tokens; because verl decoded them with
``skip_special_tokens=True``, special tokens of the original (the chat template's markers, the
EOS token) are not there: the ids are the text's, not necessarily the trained ones. Groups are
the samples with the same ``input`` text; the advantage is computed from ``score`` within each
group as verl's GRPO does (``--advantage``: 'grpo' (r - mean) / (std + 1e-6) with the sample
std; 'dr_grpo' for ``norm_adv_by_std_in_grpo=False``; 'rloo'). Every token carries gradient
(the response mask of the text). Log-probs: none in the dump, so the ledger's one point is the
behaviour policy (ratio 1), and log pi is recomputed from ``--policy.checkpoint`` when given,
unavailable (NaN) otherwise.
"""

import os
import re

from jtc import files
from jtc.interop import rollouts as rl


def step_of(path, records):
  """The step: the records' ``step`` field, else the file name ``<step>.jsonl``."""
  step = records[0].get('step') if records else None
  if isinstance(step, int) and not isinstance(step, bool):
    return step
  match = re.fullmatch(r'(\d+)\.jsonl', os.path.basename(path))
  return int(match.group(1)) if match else -1


def read(path, *, tokenizer, advantage='grpo'):
  """The `Rollout` records of one verl dump file (module docstring), tokenised with
  ``tokenizer`` (a `jtc.models.tokenizer.HFTokenizer`)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no such file {path!r} (verl writes <rollout_data_dir>/<step>.jsonl)')
  if tokenizer is None:
    raise ValueError(f'{path}: verl dumps text; pass --tokenizer HF_DIR or --policy.checkpoint '
                     'HF_DIR (a directory with the run\'s tokenizer.json) to tokenise it')
  records = files.read_jsonl(path, expected='verl rollout records (one JSON object a line)')
  step = step_of(path, records)
  out = []
  for i, record in enumerate(records, start=1):
    where = f'{path}:{i}'
    prompt, output = (rl.require(record, k, where) for k in ('input', 'output'))
    for key, value in (('input', prompt), ('output', output)):
      if not isinstance(value, str):
        raise rl.DumpError(where, key, f'expected text, found {type(value).__name__}')
    prompt_ids, completion_ids = tokenizer.encode(prompt), tokenizer.encode(output)
    if not prompt_ids or not completion_ids:
      raise rl.DumpError(where, 'input' if not prompt_ids else 'output',
                         'tokenises to no token (empty text)')
    out.append(
        rl.Rollout(where=where, step=step, group=prompt, prompt_ids=prompt_ids,
                   completion_ids=completion_ids, mask=[1.0] * len(completion_ids),
                   reward=rl.number(rl.require(record, 'score', where), 'score',
                                    where), prompt_text=prompt, completion_text=output))
  if not out:
    raise rl.DumpError(path, None, 'no sample')
  rl.fill_advantages(out, advantage)
  return out, {'format': 'verl', 'point': 'behaviour', 'advantage': advantage}
