"""`python -m jtc.plot`: training curves of runs (`jtc.cli.plot`; also `jtc plot`)."""
import sys

from jtc.cli import plot

if __name__ == '__main__':
  sys.exit(plot.main())
