r"""`python -m jtc.plot W1 W2 ... --out curves.png`: curves of runs (the code is `jtc.analysis.plot`)."""
from jtc import files
from jtc.analysis.plot import main

if __name__ == '__main__':
  with files.report_damage():
    main()
