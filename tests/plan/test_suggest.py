"""`jtc.plan.suggest`: overrides set on a copy and printed as the flags that set them again."""
import os

from absl import flags as absl_flags

from jtc.cli import absl_program
from jtc.cli import train as train_cli
from jtc.plan import suggest

CONFIG = 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'


def test_apply_sets_a_copy_and_the_flags_set_the_same_values():
  c = absl_program.load_config(os.path.join(absl_program.REPO, CONFIG))
  overrides = {'mesh.fsdp': 2, 'optim.microbatch_prompts': 1, 'policy.remat': False}
  before = c.to_dict()
  changed = suggest.apply(c, overrides)
  assert c.to_dict() == before  # the original is left as it is
  assert {k: changed[k.split('.')[0]][k.split('.')[1]] for k in overrides} == overrides
  # Round trip: the printed flags, parsed as the trainer parses them, give the same config.
  argv = ['jtc', f'--config={CONFIG}', *suggest.flags(overrides).split()]
  fv = absl_flags.FlagValues()
  train_cli.define_flags(fv, argv)
  train_cli.parse_flags(argv + ['--workdir=/tmp/unused'], fv)
  assert fv.config.to_dict() == changed.to_dict()
