"""The neutral per-token schema (``--from jsonl``) that any framework can write: one JSON object a
line, one completion each (docs/ledger.md, "Bring another framework's rollouts").

  field            type                      required
  group            string or number          yes: the completions of one prompt share it
  prompt_ids       [int]                     yes
  completion_ids   [int]                     yes
  advantage        number                    one of the two: without it the group's rewards
  reward           number                    give it (--advantage)
  mask             [0 or 1] per completion   no (all 1): 1 where the token carries gradient
  logps            [float] per completion    no: the trainer's log pi at this point
  old_logps        [float] per completion    no: the behaviour policy's (the ratio's denominator)
  sampler_logps    [float] per completion    no: the inference engine's
  ref_logps        [float] per completion    no: a reference policy's (KL terms)
  framework_coef   [float] per completion    no: your loss's d loss / d log pi per token
  truncated        bool                      no (false)
  step             int                       no (0); a file with several: --step picks one
  prompt_text, completion_text  string       no: shown by the viewer

Rows with ``logps`` must have ``old_logps`` too, and then every row must: the ledger's point is
'trainer' (ratio = exp(logps - old_logps)). Without ``logps`` the point is the behaviour policy
(ratio 1, log pi = old_logps where given). A per-token list of another length than
``completion_ids`` is refused, naming the line and the field.
"""

import os

from jtc import files
from jtc.interop import rollouts as rl

PER_TOKEN = ('mask', 'logps', 'old_logps', 'sampler_logps', 'ref_logps', 'framework_coef')


def _row(record, where):
  group = rl.require(record, 'group', where)
  if not isinstance(group, (str, int, float)) or isinstance(group, bool):
    raise rl.DumpError(where, 'group', f'{group!r}: a string or a number')
  prompt = rl.ids(rl.require(record, 'prompt_ids', where), 'prompt_ids', where)
  completion = rl.ids(rl.require(record, 'completion_ids', where), 'completion_ids', where)
  if not prompt or not completion:
    raise rl.DumpError(where, 'prompt_ids' if not prompt else 'completion_ids', 'empty')
  n = len(completion)
  per = {
      k: rl.floats(record[k], k, where, n)
      for k in PER_TOKEN
      if k in record and record[k] is not None
  }
  if 'logps' in per and 'old_logps' not in per:
    raise rl.DumpError(
        where, 'old_logps', 'missing: a row with logps needs the behaviour '
        'policy\'s old_logps (the ratio\'s denominator)')
  scalar = lambda k: None if record.get(k) is None else rl.number(record[k], k, where)
  step = record.get('step', 0)
  if isinstance(step, bool) or not isinstance(step, int):
    raise rl.DumpError(where, 'step', f'{step!r} is not an int')
  return rl.Rollout(where=where, step=step, group=group, prompt_ids=prompt,
                    completion_ids=completion, mask=per.get('mask', [1.0] * n),
                    advantage=scalar('advantage'), reward=scalar('reward'), logps=per.get('logps'),
                    old_logps=per.get('old_logps'), sampler_logps=per.get('sampler_logps'),
                    ref_logps=per.get('ref_logps'),
                    framework={'coef': per['framework_coef']} if 'framework_coef' in per else {},
                    truncated=bool(record.get('truncated',
                                              False)), prompt_text=record.get('prompt_text'),
                    completion_text=record.get('completion_text'))


def read(path, *, step=None, advantage='grpo'):
  """The `Rollout` records of one step of a neutral-schema file (module docstring)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no such file {path!r}')
  records = files.read_jsonl(path,
                             expected='jtc\'s neutral rollout schema (one JSON object a line)')
  out = [_row(r, f'{path}:{i}') for i, r in enumerate(records, start=1)]
  steps = sorted({r.step for r in out})
  if step is None and len(steps) > 1:
    raise ValueError(f'{path} holds steps {steps}; pass --step to import one')
  if step is not None:
    if step not in steps:
      raise ValueError(f'{path} has no step {step}; it holds steps {steps}')
    out = [r for r in out if r.step == step]
  if not out:
    raise rl.DumpError(path, None, 'no row')
  with_logps = [r for r in out if r.logps is not None]
  if with_logps and len(with_logps) != len(out):
    without = next(r for r in out if r.logps is None)
    raise rl.DumpError(without.where, 'logps', 'missing while other rows have it')
  rl.fill_advantages(out, advantage)
  return out, {
      'format': 'jsonl',
      'point': 'trainer' if with_logps else 'behaviour',
      'advantage': advantage,
      'framework_coef': 'framework_coef of the file' if any(r.framework for r in out) else None
  }
