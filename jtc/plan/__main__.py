"""`python -m jtc.plan`: plan a config's RL step for a TPU slice or GPUs (`jtc.cli.plan`; also
`jtc plan`)."""
import sys

from jtc.cli import plan

if __name__ == '__main__':
  sys.exit(plan.main())
