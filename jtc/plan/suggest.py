"""`--suggest`: settings of the mesh, micro-batches, sampler chunks and remat that fit.

Candidates are ordered by what they are expected to cost (fewer rematerialised forwards, more
prompts per sampler call and per micro-batch, parameters sharded over fewer chips, no tensor
parallelism), checked against the config's divisibility rules, then compiled in that order;
the first `max_compiles` that fit are compared by their estimated step time and the cheapest is
returned as the override flags to paste.
"""

import itertools

from jtc.rl import sharding as sharding_lib
from jtc.rl import update as update_lib


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def candidates(c, n_devices, model_config):
  """[(cost key, {override: value})] of the settings to try, cheapest expected first."""
  out = []
  G = c.rollout.sampling.num_samples
  tensors = [t for t in (1, 2, 4, 8) if n_devices % t == 0 and model_config.n_kv_heads % t == 0]
  micro = [m for m in _divisors(c.optim.minibatch_prompts)]
  chunks = [k for k in _divisors(c.rollout.prompts_per_step)]
  for tensor, fsdp, mb, chunk, remat in itertools.product(tensors, _divisors(n_devices), micro,
                                                          chunks, (False, True)):
    data = n_devices // (tensor * fsdp)
    if data * fsdp * tensor * c.mesh.population != n_devices:
      continue
    sizes = {'population': c.mesh.population, 'data': data, 'fsdp': fsdp, 'tensor': tensor}
    try:
      sharding_lib.check_batch_rows(mb * G, sizes)
    except ValueError:
      continue
    if (chunk * G) % (data * fsdp):
      continue
    key = (remat, -chunk, -mb, fsdp, tensor)
    out.append((key, {
        'mesh.data': data,
        'mesh.fsdp': fsdp,
        'mesh.tensor': tensor,
        'optim.microbatch_prompts': mb,
        'rollout.chunk_prompts': chunk,
        'policy.remat': remat
    }))
  return [o for _, o in sorted(out, key=lambda x: x[0])]


def apply(c, overrides):
  """A copy of config ``c`` with ``overrides`` ({'a.b': value}) set."""
  c = c.copy_and_resolve_references()
  for key, value in overrides.items():
    *path, leaf = key.split('.')
    section = c
    for p in path:
      section = section[p]
    with section.ignore_type():
      section[leaf] = value
  return c


def flags(overrides):
  return ' '.join(f'--config.{k}={v}' for k, v in overrides.items())


def suggest(c, plan_fn, n_devices, model_config, *, max_compiles=2, max_tries=12, log=print):
  """(overrides, plan) of the cheapest fitting candidate found, or (None, None). ``plan_fn(c)``
  compiles config c's stages (`planner.plan`)."""
  fitting = []
  for tries, overrides in enumerate(candidates(c, n_devices, model_config)):
    if tries >= max_tries or len(fitting) >= max_compiles:
      break
    p = plan_fn(apply(c, overrides))
    log(f'suggest: {flags(overrides)}: ' + ('fits' if p.fits else p.verdict()) +
        (f', {p.step_seconds:.4g} s per step (estimate)' if p.fits else ''))
    if p.fits:
      fitting.append((p.step_seconds, overrides, p))
  if not fitting:
    return None, None
  _, overrides, p = min(fitting, key=lambda x: x[0])
  return overrides, p
