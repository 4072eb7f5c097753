"""The text `jtc plan` prints for a `planner.Plan`: a refusal, or the per-stage table with the
resource that bounds each stage, the resident state and (when every stage compiled) the RL
step's time.
"""

from jtc.plan import hardware

GIB = hardware.GIB
COLUMNS = ('stage', 'calls/step', 'args GiB', 'out GiB', 'temp GiB', 'code MiB', '+resident GiB',
           'peak GiB', 'HBM %', 'TFLOP/chip', 'flops', 'AG GiB', 'RS GiB', 'AR GiB', 'A2A GiB',
           'est. s/call', 'bound by', 'compile s')
LEGEND = ('flops: matmul FLOPs of the lowered HLO / chips, each loop body counted as often as it '
          "runs ('loops at T tokens': the decode loop at max_new_tokens); bytes and collectives "
          '(AG all-gather, RS reduce-scatter, AR all-reduce, A2A all-to-all) from the compiled '
          'HLO, per chip; HBM traffic from the compiled sizes (a decode loop reads the weights '
          "and the live half of its cache every step); bound by: the roofline's slowest term "
          "(compute, HBM traffic, or the link's collectives)")


def _gib(x):
  return f'{x / GIB:.2f}'


def _row(r, capacity):
  cb = r.costs.collective_bytes
  return ' | '.join([
      r.stage if r.in_total else f'{r.stage} (inside sample)', f'{r.calls:g}',
      _gib(r.arguments),
      _gib(r.outputs),
      _gib(r.temporaries), f'{r.code / 2**20:.0f}',
      _gib(r.resident_other),
      _gib(r.peak), f'{100 * r.peak / capacity:.0f}', f'{r.costs.flops / 1e12:.3g}', r.flops_note,
      _gib(cb['all-gather']),
      _gib(cb['reduce-scatter']),
      _gib(cb['all-reduce']),
      _gib(cb['all-to-all']), f'{r.seconds:.3g}', r.bound, f'{r.compile_s:.1f}'
  ])


def refusal(p) -> str:
  """The compiler's refusal of plan ``p`` and the stages compiled before it."""
  before = ', '.join(f'{r.stage} {_gib(r.peak)} GiB' for r in p.rows)
  return p.failure + (f' (compiled before it, peak per chip: {before})' if before else '')


def format_table(p) -> str:
  """The per-stage table, the resident state and the RL-step totals of plan ``p``, as text; a
  plan the compiler refused is its refusal alone (no table of the stages it did not reach)."""
  if p.failure:
    return refusal(p)
  head = (f'plan: {p.target} ({p.n_devices} x {p.chip.name}, {_gib(p.capacity)} GiB HBM each), '
          f'mesh {p.mesh}; {p.compiled_for}')
  lines = [head, ' | '.join(COLUMNS), ' | '.join('---' for _ in COLUMNS)]
  lines += [_row(r, p.capacity) for r in p.rows]
  res = ', '.join(f'{k} {_gib(v)} GiB' for k, v in p.resident.items())
  lines.append(f'resident per chip across stages: {res}')
  if p.decoding is not None:
    lines.append(p.decoding.describe())
  if p.complete:
    lines.append(f'RL step (estimate, roofline at published peaks: {p.chip.source}): '
                 f'{p.step_seconds:.4g} s per step, MFU {100 * p.mfu:.1f} % '
                 f'({p.step_flops / 1e12:.4g} TFLOP per chip per step); compiled in '
                 f'{p.compile_s:.0f} s')
  else:
    lines.append(f'RL step: not estimated, only {", ".join(r.stage for r in p.rows)} compiled '
                 f'(of the step\'s stages); compiled in {p.compile_s:.0f} s')
  lines.append(LEGEND)
  verdict = p.verdict()
  lines.append(verdict if verdict else f'fits: the largest stage peaks at {_gib(p.worst.peak)} '
               f'GiB of {_gib(p.capacity)} GiB per chip ({p.worst.stage})')
  return '\n'.join(lines)
