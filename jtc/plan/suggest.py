"""`--suggest`: a setting of the mesh, micro-batches, sampler and scoring chunks, remat and (DelTA)
where its hidden states live that fits, cheapest first.

Every candidate (mesh data x fsdp x tensor over the chips, and for a mixture of experts planned
with mesh.expert = 1 also mesh.expert with the all-to-all dispatch, `optim.microbatch_prompts`,
`rollout.chunk_prompts`, `rollout.score_chunk_prompts`, `policy.remat`, with DelTA
`delta.hidden`) that the config's
divisibility rules allow gets the analytic `estimate.estimate` (no compile); those whose estimated
peak fits the chip are compiled in order of estimated step time, and the first whose compiled
stages all fit wins (the compiler's `memory_analysis()` decides, not the estimate). A candidate
whose stage that did not fit would compile to the same program as in a refused candidate (the
same mesh and the same value of each key that stage depends on, `STAGE_KEYS`) is skipped
without a compile.
"""

import dataclasses
import itertools
import math

from jtc.objectives import delta_recompute
from jtc.plan import estimate as estimate_lib
from jtc.rl import sharding as sharding_lib
from jtc.rl import update as update_lib

MESH_KEYS = ('mesh.data', 'mesh.fsdp', 'mesh.tensor')
# A mixture of experts' expert axis, searched when the config has none (`_expert_axes`).
EXPERT_KEYS = ('mesh.expert', 'policy.moe_dispatch')
# The candidate keys each stage's program depends on besides the mesh (`stages.build`: the
# sampler does not remat; DelTA's pass takes the whole step's rows and evaluation batches
# eval.batch_prompts, neither of which is searched).
STAGE_KEYS = {
    'prefill': ('rollout.chunk_prompts',),
    'sample': ('rollout.chunk_prompts',),
    'behaviour': ('rollout.score_chunk_prompts', 'delta.hidden'),
    'reference': ('rollout.score_chunk_prompts', 'delta.hidden'),
    'delta': ('rollout.score_chunk_prompts', 'delta.hidden'),
    'update': ('optim.microbatch_prompts', 'policy.remat'),
    'eval': (),
}


def _stage_program(stage, overrides):
  """What decides ``stage``'s program in a candidate: (stage, its keys' values; DelTA's pass
  over held hidden states takes the whole step's rows whatever the scoring chunk)."""
  keys = STAGE_KEYS[stage]
  if stage == 'delta' and overrides.get('delta.hidden') != 'recomputed':
    keys = ('delta.hidden',)
  return stage, tuple(overrides.get(k) for k in MESH_KEYS + EXPERT_KEYS + keys)


def _expert_axes(c, n_devices, model_config):
  """The mesh.expert sizes tried: the config's, and for a mixture of experts planned without
  one, each of 2, 4, 8, 16 that divides its experts and the chips (with the all-to-all dispatch,
  `jtc.models.moe_dispatch`; tried after every setting without one, `candidates`)."""
  own = c.mesh.get('expert', 1)
  if own > 1 or model_config is None or not model_config.is_moe:
    return [own]
  return [1] + [e for e in (2, 4, 8, 16) if model_config.n_experts % e == 0 and n_devices % e == 0]


def _hidden_modes(c):
  """[{}] or, for DelTA, [{'delta.hidden': mode}] of each of its modes (held: the behaviour
  pass's hidden states kept; recomputed: a chunk of rows at a time, 2K + 2 more forwards, so
  the estimate ranks it after held wherever held fits)."""
  if c.token_weights != 'delta':
    return [{}]
  return [{'delta.hidden': mode} for mode in delta_recompute.HIDDEN_MODES]


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def candidates(c, n_devices, model_config, chip, fit_only=True):
  """[(estimate, {override: value})] of the settings that can fit ``chip`` (all of them without
  ``fit_only``), cheapest (estimated step time) first. The estimate reads the trainer's step
  built once per mesh (`estimate.abstract_step`); a stage's estimate is computed once per value
  of the keys its program depends on (`STAGE_KEYS`)."""
  G = c.rollout.sampling.num_samples
  tensors = [t for t in (1, 2, 4, 8) if n_devices % t == 0 and model_config.n_kv_heads % t == 0]
  prompts = _divisors(c.rollout.prompts_per_step)
  work = apply(c, {})  # a copy each candidate is written into (cheaper than a copy each)
  out, memo = [], {}
  experts = _expert_axes(c, n_devices, model_config)
  for expert, tensor, fsdp in itertools.product(experts, tensors, _divisors(n_devices)):
    fixed = {'population': c.mesh.population, 'expert': expert}  # the population not searched
    searched = {} if len(experts) == 1 else {
        'mesh.expert': expert,
        'policy.moe_dispatch': 'all_to_all' if expert > 1 else c.policy.moe_dispatch
    }
    data = n_devices // (tensor * fsdp * math.prod(fixed.values()))
    sizes = {**fixed, 'data': data, 'fsdp': fsdp, 'tensor': tensor}
    if data * fsdp * tensor * math.prod(fixed.values()) != n_devices:
      continue
    step = None
    for mb, remat in itertools.product(_divisors(c.optim.minibatch_prompts), (False, True)):
      try:
        sharding_lib.check_batch_rows(mb * G, sizes)
      except ValueError:
        continue
      m = dataclasses.replace(model_config, remat=remat)
      for chunk, score, hidden in itertools.product(prompts, prompts, _hidden_modes(c)):
        overrides = {
            'mesh.data': data,
            'mesh.fsdp': fsdp,
            'mesh.tensor': tensor,
            'optim.microbatch_prompts': mb,
            'rollout.chunk_prompts': chunk,
            'rollout.score_chunk_prompts': score,
            'policy.remat': remat,
            **hidden,
            **searched
        }
        set_in(work, overrides)
        step = step or estimate_lib.abstract_step(work, m, sizes)
        est = estimate_lib.estimate(work, m, sizes, chip, step=step, memo=memo,
                                    key=lambda stage, o=overrides: _stage_program(stage, o))
        if est.peak <= chip.hbm_bytes or not fit_only:
          out.append((est, overrides))
  # Ties (the same estimated time) go to the smaller estimated peak: the likelier to fit. An
  # expert axis the config has not set comes after every other setting: the estimate does not
  # model the all-to-all, whose worst-case buffers cost more than they save (docs/models.md).
  searched = lambda o: o.get('mesh.expert', 1) > 1 and c.mesh.get('expert', 1) == 1
  return sorted(out, key=lambda x: (searched(x[1]), x[0].seconds, x[0].peak))


def apply(c, overrides):
  """A copy of config ``c`` with ``overrides`` ({'a.b': value}) set."""
  c = c.copy_and_resolve_references()
  set_in(c, overrides)
  return c


def set_in(c, overrides):
  """Sets ``overrides`` ({'a.b': value}) in config ``c`` in place."""
  for key, value in overrides.items():
    *path, leaf = key.split('.')
    section = c
    for p in path:
      section = section[p]
    try:
      section[leaf] = value
    except TypeError:  # e.g. an int for a float field
      with section.ignore_type():
        section[leaf] = value


def flags(overrides):
  return ' '.join(f'--config.{k}={v}' for k, v in overrides.items())


@dataclasses.dataclass
class Search:
  """What a search compiled: plans, how many fit (the estimate's hit rate: of the settings it
  admitted and the search compiled, the share that fit), and the seconds of every compile."""
  compiled: int = 0
  fit: int = 0
  compile_s: float = 0.0

  def summary(self):
    rate = f'{100 * self.fit / self.compiled:.0f} %' if self.compiled else 'n/a'
    return (f'{self.compiled} settings compiled in {self.compile_s:.0f} s, {self.fit} fit (hit '
            f'rate of the estimate: {rate})')


def suggest(c, plan_fn, n_devices, model_config, chip, *, max_compiles=4, log=print, search=None):
  """(overrides, plan) of the first candidate, in estimated-time order, whose compiled plan
  fits, or (None, None) after ``max_compiles`` plans. ``plan_fn(c)`` compiles config c's stages
  (`planner.plan`); ``search``: a `Search` that counts the compiles (its summary is logged)."""
  search = search if search is not None else Search()
  found = candidates(c, n_devices, model_config, chip)
  log(f'suggest: {len(found)} settings can fit by the analytic estimate; compiling the '
      f'cheapest (at most {max_compiles})')
  refused, compiles, best = set(), 0, (None, None)
  for est, overrides in found:
    if compiles == max_compiles:
      break
    if any(_stage_program(stage, overrides) in refused for stage in STAGE_KEYS):
      continue
    p = plan_fn(apply(c, overrides), stop_early=True)
    compiles += 1
    search.compiled += 1
    search.fit += p.fits
    search.compile_s += p.compile_s
    # One time per setting: the compiled plan's (the estimate's own only ranks candidates).
    said = (f'fits, peak {p.worst.peak / 2**30:.2f} GiB, {p.step_seconds:.4g} s per step'
            if p.fits else p.verdict())
    log(f'suggest: {flags(overrides)}: estimated peak {est.peak / 2**30:.2f} GiB; compiled in '
        f'{p.compile_s:.0f} s: {said}')
    if p.fits:
      best = overrides, p
      break
    if p.failed_stage in STAGE_KEYS:
      refused.add(_stage_program(p.failed_stage, overrides))
  log(f'suggest: {search.summary()}')
  return best
