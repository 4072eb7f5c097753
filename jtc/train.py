"""`python -m jtc.train`: the RL trainer's command (`jtc.cli.train`; also `jtc train`)."""
import sys

from jtc.cli import train

if __name__ == '__main__':
  sys.exit(train.main())
