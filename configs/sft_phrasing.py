"""Supervised training of the phrasing base policy: arithmetic with one chain of thought and three
equally rewarded, equally long phrasings of the final answer (jtc/data/tasks/phrasing.py).

Rebuild the policy that ships in jtc/assets/phrasing_policy (400 steps; 15 min on 2 busy CPU cores):
  python -m jtc.sft --config configs/sft_phrasing.py --workdir /tmp/jtc/sft_phrasing \
      --config.export_to=jtc/assets/phrasing_policy
Smoke test:
  python -m jtc.sft --config configs/sft_phrasing.py:smoke --workdir /tmp/jtc/sft_phrasing_smoke
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = 'phrasing'
  c.tokenizer = ml_collections.ConfigDict({'kind': 'char'})
  c.model_preset = 'tiny'  # a jtc.models.model.ModelConfig classmethod
  c.prompt_width = 20  # P, as in configs/common.py
  c.max_new_tokens = 48  # T: the longest solution (46 tokens with EOS) fits
  c.train_problems = 5000  # the data pipeline builds 5000 train problems
  c.eval_problems = 256
  c.eval_k = 4
  c.batch_size = 64
  c.num_steps = 400  # held-out avg@4: 400 -> 41.6%, 1300 -> 98.4% (chain of thought)
  c.warmup_steps = 30
  c.learning_rate = 2e-3
  c.weight_decay = 0.01
  c.export_to = ''  # also write the bundle here (e.g. jtc/assets/phrasing_policy)
  if arg == 'smoke':
    c.num_steps = 4
    c.train_problems = 64
    c.eval_problems = 8
    c.eval_k = 2
    c.batch_size = 8
    c.warmup_steps = 1
  elif arg:
    raise ValueError(f'unknown config arg {arg!r}; valid: smoke')
  return c
