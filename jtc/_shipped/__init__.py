"""The repository's `configs/` and `experiments/` folders as an installed jtc ships them (setup.py).

In a checkout this folder is empty; in a wheel it holds `configs/` and `experiments/`, which
jtc's commands put on their own import path (`jtc.cli.absl_program.REPO`), never site-packages'.
"""

__all__ = []
