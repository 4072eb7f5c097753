"""`python -m jtc.sft`: supervised fine-tuning of a base policy (`jtc.cli.sft`; also `jtc sft`)."""
import sys

from jtc.cli import sft

if __name__ == '__main__':
  sys.exit(sft.main())
