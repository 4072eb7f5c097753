"""A sweep's runs as seed populations: one `python -m jtc.train` program per group of runs that
differ only in seed or in hyper-parameters a population may vary (`jtc.rl.population`).

`programs(specs)` groups the run x seed specs still to run: specs with the same config, the same
overrides apart from the seed and the varied keys (`optim.learning_rate`,
`rollout.sampling.temperature`, a float of `loss.hparams`), and the same set of varied keys, over
a contiguous range of seeds, become one `Program` whose members are exactly those specs (a
member equals the single run of its seed and values: tests/rl/test_population.py). Each member
writes its run into ``<program workdir>/members/<name>/``, from which the runner writes the same
per-run summary as for a single process.
"""

import dataclasses
import hashlib
import itertools
import json
import os
import sys

from jtc.rl import population as population_lib

# Overrides that say which run a spec is, not how a member differs from another.
_PER_RUN = ('seed',)


def is_variable(key, value):
  """Whether a population may vary ``key`` between its members (a float it reads traced)."""
  return key in population_lib.VARIABLE_KEYS or (key.startswith('loss.hparams.') and isinstance(
      value, float) and not isinstance(value, bool))


def _fmt(value):
  return repr(value) if isinstance(value, float) else str(value)


@dataclasses.dataclass(frozen=True)
class Program:
  """One population: ``specs`` (run x seed specs) = seeds first_seed .. first_seed + size - 1
  crossed with every combination of the ``vary`` values."""
  config_path: str
  shared: tuple  # ((key, value), ...) the members' common overrides
  first_seed: int
  size: int
  vary: tuple  # ((key, (value, ...)), ...)
  specs: tuple

  @property
  def key(self):
    blob = json.dumps([
        self.config_path, [[k, _fmt(v)] for k, v in self.shared], self.first_seed, self.size,
        [[k, [_fmt(x) for x in vs]] for k, vs in self.vary]
    ])
    return hashlib.sha1(blob.encode()).hexdigest()[:10]

  @property
  def name(self):
    return (f'pop__{self.specs[0].run.config}__s{self.first_seed}-'
            f'{self.first_seed + self.size - 1}__{self.key}')

  def vary_flag(self):
    return ';'.join(f'{k}={",".join(_fmt(x) for x in vs)}' for k, vs in self.vary)

  def command(self, workdir):
    """The `python -m jtc.train` argv of the population."""
    flags = [f'--config.{k}={_fmt(v)}' for k, v in self.shared]
    flags += [f'--config.seed={self.first_seed}', f'--config.population.size={self.size}']
    if self.vary:
      flags.append(f'--config.population.vary={self.vary_flag()}')
    return [
        sys.executable, '-m', 'jtc.train', f'--config={self.config_path}', f'--workdir={workdir}'
    ] + flags

  def member_dir(self, workdir, spec):
    """Where ``spec``'s run is written: its member's directory (the workdir itself when the
    program is a single run, as `jtc.rl.population.member_dir` has it)."""
    if len(self.specs) == 1:
      return workdir
    values = dict(spec.overrides)
    member = population_lib.Member(index=0, seed=spec.seed, values=tuple(
        (k, float(values[k])) for k, _ in self.vary))
    return os.path.join(workdir, 'members', member.name)


def _split(spec):
  """(group key, {varied key: value}) of a spec."""
  varied = {k: v for k, v in spec.overrides if is_variable(k, v)}
  shared = tuple((k, v) for k, v in spec.overrides if k not in varied and k not in _PER_RUN)
  return (spec.config_path, shared, tuple(sorted(varied))), varied


def _segments(seeds):
  """Sorted seeds -> maximal runs of consecutive ones."""
  out = []
  for _, run in itertools.groupby(enumerate(sorted(seeds)), key=lambda t: t[1] - t[0]):
    out.append([s for _, s in run])
  return out


def programs(specs):
  """The specs as populations (module docstring); a group whose combinations of varied values
  are not a full cross product of its keys is split into one population per combination."""
  groups = {}
  for spec in specs:
    key, varied = _split(spec)
    groups.setdefault(key, {}).setdefault(tuple(varied.items()), []).append(spec)
  out = []
  for (config_path, shared, keys), by_combo in groups.items():
    by_seeds = {}
    for combo, combo_specs in by_combo.items():
      for seg in _segments([s.seed for s in combo_specs]):
        by_seeds.setdefault(tuple(seg), []).append(combo)
    for seeds, combos in by_seeds.items():
      values = [tuple(dict.fromkeys(dict(c)[k] for c in combos)) for k in keys]
      full = len(combos) == len(list(itertools.product(*values)))
      for part in ([combos] if full else [[c] for c in combos]):
        values = {k: tuple(dict.fromkeys(dict(c)[k] for c in part)) for k in keys}
        # A key with one value in this population is set, not varied (the single-run program).
        fixed = tuple((k, v[0]) for k, v in values.items() if len(v) == 1)
        vary = tuple((k, v) for k, v in values.items() if len(v) > 1)
        members = [s for c in part for s in by_combo[c] if s.seed in seeds]
        out.append(
            Program(config_path=config_path, shared=shared + fixed, first_seed=seeds[0],
                    size=len(seeds), vary=vary, specs=tuple(members)))
  return out
