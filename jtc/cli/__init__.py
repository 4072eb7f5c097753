r"""The commands, one thin module each over a library function: `jtc <command> ...`.

  jtc train  --config configs/<method>.py[:smoke|runlocal] --workdir W   (jtc.rl.trainer)
  jtc sft    --config configs/sft_arith.py --workdir W                    (jtc.rl.sft_trainer)
  jtc ledger steps|replay|html W ...                                     (jtc.analysis.replay)
  jtc plot   W1 [W2 ...] --out curves.png                                (jtc.analysis.curve_plots)
  jtc plan   --config configs/real/<config>.py --topology v5e-64          (jtc.plan.planner)
  jtc data   PATH [--show N]                                             (jtc.data.formats)
  jtc conform --loss MODULE:FUNCTION --objective NAME --aggregation AGG   (jtc.interop.conform)
  jtc sweep  table1 [--tables-only]                                      (experiments.run)
  jtc export WORKDIR OUT [--member N]                                    (jtc.rl.export)
  jtc eval   --checkpoint DIR --dataset PATH [--k K]                     (jtc.rl.checkpoint_eval)
  jtc tiny-checkpoint OUT --like qwen3                                   (jtc.models.tiny_checkpoint)

`jtc` is the console script (setup.py); ``python -m jtc.<command>`` runs the same `main`.
Each command module has ``main(argv=None, prog=...)`` (``argv`` without the program name) and
``define_flags(flag_values)`` (absl commands) or ``make_parser(prog)`` (argparse commands).
"""
import importlib
import sys

# command -> what it does (its module is jtc.cli.<command>, imported when it runs).
COMMANDS = {
    'train': 'RL training of a config (one run or a seed population)',
    'sft': 'supervised fine-tuning of a base policy',
    'ledger': "a run's per-token ledger: its steps, replay under other objectives, the viewer",
    'plot': 'training curves of runs',
    'plan': "a config's RL step compiled for a TPU slice (or estimated for GPUs) before a run",
    'data': 'how jtc reads a dataset file or directory (format, rows, parsed pairs)',
    'conform': "anyone's RL loss checked against jtc's per-token coefficients and invariances",
    'sweep': 'a sweep of experiments/ and its results file (python -m experiments.run)',
    'export': "a run's trained policy as a Hugging Face directory",
    'eval': "a checkpoint's avg@k and pass@k on a dataset, per data source",
    'tiny-checkpoint': 'a random tiny Hugging Face checkpoint with a tokenizer, for smoke runs',
}

# The command modules, then the dispatcher.
__all__ = [
    'absl_program', 'conform', 'data', 'eval', 'export', 'ledger', 'plan', 'plot', 'sft', 'sweep',
    'tiny_checkpoint', 'train', 'COMMANDS', 'command_module', 'main'
]


def command_module(name):
  """The module of command ``name``; ValueError naming the valid commands for another name."""
  if name not in COMMANDS:
    raise ValueError(f'unknown command {name!r}; valid: {", ".join(COMMANDS)}')
  return importlib.import_module(f'jtc.cli.{name.replace("-", "_")}')


def _usage():
  return 'usage: jtc <command> [args]  (jtc <command> --help for its flags)\n\ncommands:\n' + ''.join(
      f'  {name:16s}{what}\n' for name, what in COMMANDS.items())


def main(argv=None):
  """`jtc <command> [args]`: runs ``jtc.cli.<command>.main(args)``; returns the exit status."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ('-h', '--help'):
    print(_usage(), file=sys.stdout if argv else sys.stderr, end='')
    return 0 if argv else 2
  try:
    module = command_module(argv[0])
  except ValueError as e:
    print(f'jtc: error: {e}\n\n{_usage()}', file=sys.stderr, end='')
    return 2
  return module.main(argv[1:], prog=f'jtc {argv[0]}')
