r"""`python -m jtc.train`: the RL trainer's command line (the trainer is `jtc.rl.trainer`).

  python -m jtc.train --config configs/<method>.py[:smoke|runlocal] --workdir W [--config.key=value]
"""
from jtc.rl.trainer import Trainer, main  # pylint: disable=unused-import

if __name__ == '__main__':
  main()
