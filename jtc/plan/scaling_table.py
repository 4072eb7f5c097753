r"""The generated table of docs/scaling.md: every real config planned on the slices it targets.

  nice -n 5 python -m jtc.plan.scaling_table      # compiles each row (hours), rewrites the table
  nice -n 5 python -m jtc.plan.scaling_table 0_6b llama   # only the rows whose config or slice
                                                          # contains one of these (the rest kept)
  nice -n 5 python -m jtc.plan.scaling_table --replan 8b_math   # plan those rows again

Rows: every `configs/real/*` config on v5e-8, v5e-64, v5p-64 and v6e-16; Qwen3-32B, the
Qwen3-14B DelTA config (30k tokens) and Qwen3-30B-A3B (MoE, 32k) on v5p-128 and v5p-256; the largest seed population of
Qwen3-0.6B that fits one v5e-8 (8, 4, 2 members tried in that order, each member on its own
chips). A row is planned as configured when the
analytic estimate (`estimate.estimate`) says it can fit; otherwise, or when its compiled plan
does not fit, `suggest.suggest` compiles the cheapest settings that can. A row where no setting
passes the estimate says so with the estimate's numbers (nothing compiled). Finished rows are
kept in docs/scaling_plans.json, so an interrupted run resumes; the table between the markers
in docs/scaling.md is replaced, nothing else. Each row records the code revision that planned it
(its 'planned at' column); `--replan` plans the matching rows again from the current code.
"""

import argparse
import glob
import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from jtc.plan import estimate as estimate_lib  # noqa: E402
from jtc.plan import hardware  # noqa: E402
from jtc.plan import planner  # noqa: E402
from jtc.plan import suggest as suggest_lib  # noqa: E402
from jtc.cli import absl_program  # noqa: E402
from jtc.rl import distributed  # noqa: E402
from jtc.rl import sharding as sharding_lib  # noqa: E402
from jtc.rl import update as update_lib  # noqa: E402

REPO = absl_program.REPO
DOC = os.path.join(REPO, 'docs', 'scaling.md')
CACHE = os.path.join(REPO, 'docs', 'scaling_plans.json')
BEGIN, END = '<!-- plan table: begin -->', '<!-- plan table: end -->'
SLICES = ('v5e-8', 'v5e-64', 'v5p-64', 'v6e-16')
POPULATIONS = (8, 4, 2)
MAX_COMPILES = 3  # settings `suggest` compiles per row at most
# Every stage but the prefill, which the sample stage's program contains (its own row in a plan
# only shows the prompts' part).
STAGES = ('sample', 'behaviour', 'reference', 'delta', 'update', 'eval')


def rows():
  """[(config path, slice, overrides)] in the order they are planned (the papers' scale first),
  the population rows last."""
  configs = sorted(glob.glob(os.path.join(REPO, 'configs', 'real', '*.py')))
  configs = [
      os.path.relpath(p, REPO)
      for p in configs
      if os.path.basename(p) not in ('__init__.py', 'base.py')
  ]
  big = [p for p in configs if any(k in p for k in ('32b', '14b', '30b', '80b'))]  # whole pods
  out = [(p, s, {}) for p in big for s in ('v5p-256', 'v5p-128')]
  out += [(p, s, {}) for p in big + [q for q in configs if q not in big] for s in SLICES]
  return out


def population_rows():
  small = [p for p in rows() if '0_6b' in p[0]][0][0]
  return [(small, 'v5e-8', {
      'population.size': n,
      'mesh.population': n,
      'mesh.data': -1
  }) for n in POPULATIONS]


def _estimate(c, model_config, n_devices, chip):
  """The config's own `estimate.Estimate`, or None when its mesh does not fit the chips."""
  try:
    sizes = sharding_lib.mesh_sizes(**c.mesh, n_devices=n_devices)
    sharding_lib.check_batch_rows(
        update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples, sizes)
  except ValueError:
    return None
  return estimate_lib.estimate(c, model_config, sizes, chip)


def _result(p, setting, note, est, compile_s):
  """The row of plan ``p``; ``compile_s``: every compile the row took (refused and
  non-fitting settings included)."""
  return dict(fits=p.fits, peak=p.worst.peak if p.rows else None, mesh=p.mesh, setting=setting,
              step_s=p.step_seconds, mfu=p.mfu, note=note, compile_s=compile_s,
              stages={r.stage: r.peak for r in p.rows}, est_peak=est.peak if est else None,
              est_stages=est.stage_bytes if est else None)


def plan_row(path, slice_name, overrides, log):
  """{'fits', 'peak', 'mesh', 'setting', 'step_s', 'mfu', 'compile_s', 'stages', 'note', ...}."""
  c = suggest_lib.apply(absl_program.load_config(os.path.join(REPO, path)), overrides)
  name = hardware.topology_name(slice_name)
  devices = hardware.topology_devices(name)
  chip = hardware.chip_of(name)
  model_config = planner.model_config_for(c, 'tpu')
  plan_fn = lambda cfg, **kw: planner.plan(cfg, devices, platform='tpu', chip=chip, target=
                                           slice_name, compiled_for='libtpu', log=log, only=STAGES,
                                           **kw)
  est = _estimate(c, model_config, len(devices), chip)
  search = suggest_lib.Search()
  if est is None:
    note = 'as configured: its mesh or batch does not split over the slice'
  elif est.peak > chip.hbm_bytes:
    note = f'as configured: estimated {est.peak / hardware.GIB:.0f} GiB per chip'
  else:
    p = plan_fn(c, stop_early=True)
    search.compile_s += p.compile_s
    if p.fits:
      return _result(p, '', 'as configured', est, search.compile_s)
    note = f'as configured: {p.verdict()}'
  everything = suggest_lib.candidates(c, len(devices), model_config, chip, fit_only=False)
  if not any(e.peak <= chip.hbm_bytes for e, _ in everything):
    low = min((e.peak for e, _ in everything), default=float('nan'))
    return dict(
        fits=False, note=f'{note}; no setting fits by the estimate (at best '
        f'{low / hardware.GIB:.0f} GiB per chip)')
  log(f'{note}; suggesting')
  best, bp = suggest_lib.suggest(c, plan_fn, len(devices), model_config, chip,
                                 max_compiles=MAX_COMPILES, log=log, search=search)
  if best is None:
    return dict(
        fits=False, note=f'{note}; the {MAX_COMPILES} cheapest settings that can fit '
        'did not compile to a fit', compile_s=search.compile_s)
  c = suggest_lib.apply(c, best)
  return _result(bp, suggest_lib.flags(best), f'suggested ({note})',
                 _estimate(c, model_config, len(devices), chip), search.compile_s)


def _revision_markdown(r):
  """The short revision that planned row ``r`` ('+' when its code had uncommitted changes); '-'
  for rows planned before revisions were recorded."""
  rev = r.get('revision')
  return rev[:7] + ('+' if '+dirty' in rev else '') if rev else '-'


def _row_markdown(key, r):
  path, slice_name, overrides = json.loads(key)
  name = os.path.basename(path)[:-3] + ''.join(
      f' ({v} members)' for k, v in overrides.items() if k == 'population.size')
  rev = _revision_markdown(r)
  if not r['fits']:
    return f"| {name} | {slice_name} | no | - | - | - | {r['note']} | - | - | {rev} |"
  m = r['mesh']
  mesh = f"({m['data']}, {m['fsdp']}, {m['tensor']})" + (f" x {m['population']} members"
                                                         if m['population'] > 1 else '')
  est = f"{r['est_peak'] / hardware.GIB:.1f}" if r.get('est_peak') else '-'
  return (f"| {name} | {slice_name} | yes | {r['peak'] / hardware.GIB:.1f} | {est} | {mesh} | "
          f"{r['setting'] or 'as configured'} | {r['step_s']:.3g} | {r['compile_s']:.0f} | {rev} |")


def markdown(results):
  lines = [
      BEGIN, '', 'Generated by `nice -n 5 python -m jtc.plan.scaling_table` (every stage compiled '
      'for the slice by libtpu, without the hardware). Peak: the compiled largest stage per chip; '
      'est.: the analytic estimate `--suggest` filters with (`jtc.plan.estimate`); s/step: the '
      'roofline *estimate* of one RL step; compile: seconds to compile the stages on a busy '
      '2-core machine; planned at: the code revision that planned the row (\'-\': before '
      'revisions were recorded, i.e. before 9917234).', '',
      '| config | slice | fits | peak GiB/chip | est. GiB | mesh (data, fsdp, tensor) | setting '
      '| est. s/step | compile s | planned at |', '|---|---|---|---|---|---|---|---|---|---|'
  ]
  lines += [_row_markdown(key, r) for key, r in results.items()]
  lines += ['', END]
  return '\n'.join(lines)


def write(results):
  with open(CACHE, 'w') as f:
    json.dump(results, f, indent=1)
  with open(DOC) as f:
    text = f.read()
  table = markdown(results)
  if BEGIN in text:
    text = text[:text.index(BEGIN)] + table + text[text.index(END) + len(END):]
  else:
    text += '\n' + table + '\n'
  with open(DOC, 'w') as f:
    f.write(text)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
      'match', nargs='*', help='plan only the rows whose config path or slice '
      'contains one of these (default: every row)')
  parser.add_argument('--replan', action='store_true',
                      help='plan the matching rows again even if docs/scaling_plans.json has them')
  args = parser.parse_args(argv)
  if args.replan and not args.match:
    parser.error('--replan needs the rows to plan again named (e.g. --replan 8b_math); '
                 'it does not replan the whole table')
  log = lambda m: print(m, file=sys.stderr, flush=True)
  results = {}
  if os.path.exists(CACHE):
    with open(CACHE) as f:
      results = json.load(f)
  todo = rows() + population_rows()
  names = [f'{path} {slice_name}' for path, slice_name, _ in todo]
  unknown = [m for m in args.match if not any(m in n for n in names)]
  if unknown:
    parser.error(f'{unknown} match no row; the rows: {sorted(set(names))}')
  keys = [json.dumps(list(row)) for row in todo]
  revision, planned = distributed.code_revision(
      exclude=('docs',)), set()  # planned: the rows this run planned
  for key, name, (path, slice_name, overrides) in zip(keys, names, todo):
    if args.match and not any(m in name for m in args.match):
      continue
    if key not in results or args.replan:
      current = {k: r for k, r in results.items() if k in planned or not args.replan}
      if overrides.get('population.size') and any(
          r['fits'] for k, r in current.items() if 'population.size' in json.loads(k)[2]):
        continue  # a larger population already fits
      log(f'== {key}')
      results[key] = dict(plan_row(path, slice_name, overrides, log), revision=revision)
      planned.add(key)
      # The table in the rows' order; a kept row no longer planned (its config removed) last.
      results = {k: results[k] for k in keys + list(results) if k in results}
      write(results)
  write(results)


if __name__ == '__main__':
  main()
