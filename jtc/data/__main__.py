"""`python -m jtc.data PATH`: how jtc reads a dataset (`jtc.cli.data`; also `jtc data`)."""
import sys

from jtc.cli import data

if __name__ == '__main__':
  sys.exit(data.main())
