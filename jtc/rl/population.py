r"""Seed populations: E members of one configuration trained by one program.

  python -m jtc.train --config configs/gspo.py --config.population.size=8 --workdir W
  python -m jtc.train --config configs/gspo.py --config.population.size=8 \
      --config.population.vary='optim.learning_rate=5e-5,1e-4,2e-4' --workdir W   # 24 members

Config (`configs/common.py`):
  population.size  seeds per setting: the members' seeds are seed, seed + 1, ..., seed + size - 1
  population.vary  'KEY=v1,v2[;KEY2=w1,w2]': settings of hyper-parameters that can differ inside one
                   compiled program (`VARIABLE_KEYS`), crossed with the seeds
  mesh.population  devices the members are sharded over (it divides the number of members)

Member m = setting k * size + seed offset j has seed ``seed + j`` and the k-th combination of
the varied values; it is exactly the single run of its own config (`member_config`): the same
data order, PRNG streams and step-1 rollouts (tests/rl/test_population.py). Its outputs go to
``W/members/<name>/`` (`member_dir`), laid out as a single run's workdir, so plots, reports and the
experiments runner read a member as a run; the population's checkpoint is ``W/checkpoints``.

On the device every train-state leaf, batch and per-member value carries a leading member axis
[E, ...] and the step functions are vmapped over it (`Population.map`); with E = 1 there is no
member axis and every function is the single run's, unchanged (bit for bit).
"""

import dataclasses
import itertools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jtc import checks
from jtc.models import lora
from jtc.rl import workdir as workdir_lib

# Hyper-parameters that can differ between the members of one program: each is read inside the
# compiled step as a traced value (the rest of the config is structural: shapes, the loss, the
# model, the task). Every float of `loss.hparams` qualifies too (`variable_keys`).
VARIABLE_KEYS = ('optim.learning_rate', 'rollout.sampling.temperature')


@dataclasses.dataclass(frozen=True)
class Member:
  """Member ``index`` of a population: its seed and its values of the varied keys."""
  index: int
  seed: int
  values: tuple = ()  # ((key, value), ...) in `population.vary` order

  @property
  def name(self):
    """Its directory name: 'seed3', or 'seed3__optim.learning_rate=0.0001' when keys vary."""
    return '__'.join([f'seed{self.seed}'] + [f'{k}={v!r}' for k, v in self.values])


def variable_keys(c):
  """The keys `population.vary` accepts for config ``c``: `VARIABLE_KEYS` and every float of
  ``loss.hparams`` (a hyper-parameter that is off by default counts when it takes floats)."""
  floats = [
      f'loss.hparams.{k}' for k, v in c.loss.hparams.items()
      if isinstance(v, float) or (v is None and c.loss.hparams.get_type(k) is float)
  ]
  return VARIABLE_KEYS + tuple(sorted(floats))


def parse_vary(text, valid_keys):
  """'KEY=v1,v2;KEY2=w1' -> ((KEY, (v1, v2)), (KEY2, (w1,))) with float values; a ValueError
  naming the bad key or value, and the valid keys, otherwise."""
  out = []
  for part in (p.strip() for p in (text or '').split(';')):
    if not part:
      continue
    key, sep, values = (s.strip() for s in part.partition('='))
    if not sep or not values:
      raise ValueError(f"config.population.vary: {part!r} is not 'KEY=v1,v2,...'")
    if key not in valid_keys:
      raise ValueError(f'config.population.vary: {key!r} cannot vary inside one program (it is '
                       f'structural or unknown); valid: {list(valid_keys)}')
    if key in dict(out):
      raise ValueError(f'config.population.vary names {key!r} twice')
    try:
      floats = tuple(float(v) for v in values.split(','))
    except ValueError:
      raise ValueError(f'config.population.vary: {key}={values!r} must be a comma-separated '
                       'list of numbers') from None
    if len(set(floats)) != len(floats):
      raise ValueError(f'config.population.vary: {key} repeats a value: {values!r}')
    out.append((key, floats))
  return tuple(out)


def members(c):
  """The members of config ``c``: settings (the product of the varied values) x seeds."""
  vary = parse_vary(c.population.vary, variable_keys(c))
  keys = [k for k, _ in vary]
  settings = list(itertools.product(*[v for _, v in vary]))
  return tuple(
      Member(index=k * c.population.size + j, seed=c.seed + j, values=tuple(zip(keys, setting)))
      for k, setting in enumerate(settings)
      for j in range(c.population.size))


def member_config(c, member):
  """The single-run config of ``member``: its seed and values, no population."""
  m = ml_collections.ConfigDict(c.to_dict(), type_safe=False)
  m.seed = member.seed
  m.population.size, m.population.vary, m.mesh.population = 1, '', 1
  for key, value in member.values:
    *path, leaf = key.split('.')
    section = m
    for p in path:
      section = section[p]
    section[leaf] = value
  return ml_collections.ConfigDict(m.to_dict())


def check_config(c):
  """The population section (size, vary, the mesh's population axis), before any compute."""
  checks.positive_int('config.population.size', c.population.size)
  checks.positive_int('config.mesh.population', c.mesh.population)
  n = len(members(c))  # parses `vary`, naming a bad key or value
  if n % c.mesh.population:
    raise ValueError(f'config.mesh.population={c.mesh.population} does not divide the {n} members '
                     '(population.size x the settings of population.vary)')


def member_dir(workdir, population, member):
  """Where ``member`` writes its metrics: the workdir itself for a single run."""
  if not population.batched:
    return workdir
  return os.path.join(workdir, 'members', member.name)


def write_member_file(path, workdir, member):
  """Marks a member directory (`MEMBER_FILE`): a trainer refuses to use it as a workdir."""
  with open(os.path.join(path, workdir_lib.MEMBER_FILE), 'w') as f:
    json.dump(
        {
            'population_workdir': os.path.abspath(workdir),
            'index': member.index,
            'seed': member.seed,
            'values': dict(member.values)
        }, f, indent=1)


def record(workdir, config, schedule_steps, population, *, write=True):
  """Writes config.json of the run (the population's), and for a population each member's
  directory with its own single-run config.json and `workdir.MEMBER_FILE`; returns the
  directories the members write their metrics to (``[workdir]`` for a single run). With
  ``write=False`` (a multi-process run's other processes) it only returns them."""
  if write:
    workdir_lib.record_config(workdir, config, schedule_steps)
  dirs = []
  for member in population.members:
    path = member_dir(workdir, population, member)
    if path != workdir and write:
      os.makedirs(path, exist_ok=True)
      workdir_lib.record_config(path, member_config(config, member), schedule_steps)
      write_member_file(path, workdir, member)
    dirs.append(path)
  return dirs


@dataclasses.dataclass(frozen=True)
class Population:
  """The members of one program and how per-member values are laid out on the device."""
  members: tuple

  @classmethod
  def of(cls, c):
    return cls(members(c))

  @property
  def n(self):
    return len(self.members)

  @property
  def batched(self):
    """Whether values carry a leading member axis (E > 1)."""
    return self.n > 1

  def map(self, fn, spmd=False):
    """``fn`` over the member axis (vmap), or ``fn`` itself for a single run; an argument's
    `lora.Adapted` policy maps its adapters only (the base is shared). ``spmd``: ``fn``
    constrains shardings (a ``row_sharding``), whose member axis is then the mesh's
    'population' axis."""
    if not self.batched:
      return fn
    name = 'population' if spmd else None

    def mapped(*args, **kwargs):
      if not lora.has_adapted(args):
        return jax.vmap(fn, spmd_axis_name=name)(*args, **kwargs)
      # A LoRA policy's base is shared: one copy, not mapped; its adapters carry the members.
      in_axes = tuple(lora.member_in_axes(a) for a in args)
      return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=name)(*args, **kwargs)

    return mapped

  def stack(self, per_member):
    """A list of E per-member pytrees -> one pytree with a leading member axis (the single
    member's pytree as it is when E = 1)."""
    if not self.batched:
      return per_member[0]
    stack = lambda *xs: (np.stack(xs) if isinstance(xs[0], np.ndarray) else jnp.stack(xs))
    return jax.tree.map(stack, *per_member)

  def unstack(self, tree):
    """The inverse of `stack`: a list of E per-member pytrees."""
    if not self.batched:
      return [tree]
    return [jax.tree.map(lambda x, m=m: x[m], tree) for m in range(self.n)]

  def values(self, key):
    """[E] float32 of a varied key (stacked as `stack`), or None when ``key`` does not vary."""
    if key not in dict(self.members[0].values):
      return None
    return self.stack([np.float32(dict(m.values)[key]) for m in self.members])

  def varied(self, prefix=''):
    """{key: `values(key)`} of the varied keys starting with ``prefix``."""
    return {k: self.values(k) for k, _ in self.members[0].values if k.startswith(prefix)}

  @staticmethod
  def value(member, key, default):
    """``member``'s value of ``key``: its own where the population varies it, else ``default``
    (the config's)."""
    return dict(member.values).get(key, default)

  def member(self, tree, m, sharding):
    """Member ``m``'s slice of a stacked pytree, placed with ``sharding`` (e.g. replicated, so
    that every process of a multi-process run holds it whole); the tree itself for one run."""
    if not self.batched:
      return tree
    return jax.jit(lambda t: jax.tree.map(lambda x: x[m], t), out_shardings=sharding)(tree)

  def fold_in(self, keys, data):
    """`jax.random.fold_in` of every member's key."""
    fold = lambda k: jax.random.fold_in(k, data)
    return jax.vmap(fold)(keys) if self.batched else fold(keys)

  def keys(self, fn):
    """Every member's key ``fn(member)``, stacked."""
    return self.stack([fn(m) for m in self.members])


def loss_hparams(base, hparams):
  """The loss's hyper-parameters of one member: ``base`` (the config's `loss.hparams`) with the
  member's traced values of the varied 'loss.hparams.<k>' keys of ``hparams`` (`varied`) in
  place of theirs (the update and the diagnostics read them so)."""
  prefix = 'loss.hparams.'
  return dict(base, **{k[len(prefix):]: v for k, v in hparams.items() if k.startswith(prefix)})


SINGLE = Population((Member(index=0, seed=0),))  # a single run (no member axis)
