"""`python -m jtc.ledger`: the per-token ledger of a run (`jtc.cli.ledger`; also `jtc ledger`)."""
import sys

from jtc.cli import ledger

if __name__ == '__main__':
  sys.exit(ledger.main())
