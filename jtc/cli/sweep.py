r"""`jtc sweep` / `python -m experiments.run`: runs a sweep of experiments/sweeps and writes its
results file (the command line is `experiments.run`'s, its documentation there).

  jtc sweep table1 --tables-only
  jtc sweep table1 --seeds 8 --jobs 2

In a checkout the two commands are the same; an installed jtc ships `experiments/` inside its
own namespace (setup.py), so there `jtc sweep` is the way to run it.
"""

from jtc.cli import absl_program


def main(argv=None, prog='jtc sweep'):
  """The command: ``argv`` without the program name (None: the process's); its exit status."""
  absl_program.repo_on_path()
  from experiments import run  # pylint: disable=import-outside-toplevel
  return run.main(argv, prog=prog)
