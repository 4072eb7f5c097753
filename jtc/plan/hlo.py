"""What a compiled program does per chip, read from its optimised HLO text: matmul FLOPs and
collective bytes, each multiplied by the trip counts of the loops around it.

XLA's `cost_analysis()` counts a `while` body once, however many times it runs (a scan over Y
layers, a scan over micro-batches or vocabulary chunks); `program_costs` walks the call graph
instead: computation c's multiplier is the sum over its callers of caller multiplier x (the
loop's trip count when c is a while body). A trip count is read from the loop condition
(``counter < constant``, minus the counter's constant start); a loop whose bound is not a
constant (the sampler's stop-at-EOS loop, a decode step's live blocks) takes ``unknown_trips``
(by nesting depth among such loops), which the caller states.

  * FLOPs: 2 x output elements x contracted size of every dot / convolution (matmuls; the
    elementwise work is not counted), per chip. A `ragged-dot` (`jax.lax.ragged_dot`, the MoE
    experts' grouped matmul; XLA's cost analysis counts none) counts its real rows once: 2 m k n
    for m rows of k against their group's [k, n] (forward and input gradient), and for its
    weight gradient, whose ragged dimension is contracted into a [g, k, n] output, 2 m k n too
    (the output's g groups each see only their own rows: 1/g of a dense count).
  * A `jax.shard_map` body (in a lowered program, a call of `xla.sdy.manual_computation_body`)
    holds one shard's shapes: it counts once per shard of its manual mesh axes.
  * Collective bytes: the output bytes of all-gather, reduce-scatter, all-reduce and
    all-to-all (and their -start forms; every peer's buffer of a tuple-shaped all-to-all), once
    per collective channel.
"""

import collections
import dataclasses
import math
import re

DTYPE_BYTES = {
    'pred': 1,
    's8': 1,
    'u8': 1,
    's16': 2,
    'u16': 2,
    'f16': 2,
    'bf16': 2,
    's32': 4,
    'u32': 4,
    'f32': 4,
    's64': 8,
    'u64': 8,
    'f64': 8,
    'c64': 8,
    'c128': 16,
    'f8e4m3fn': 1,
    'f8e5m2': 1,
    's4': 1,
    'u4': 1,
    'token': 0
}
COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all')
_ARRAY = re.compile(r'([a-z]+[0-9a-z]*)\[([0-9,]*)\]')
_HEADER = re.compile(r'^(ENTRY )?%?([\w.\-]+)(?: \((.*)\) -> .*)? \{$')
_INSTR = re.compile(r'^\s*(ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$')


@dataclasses.dataclass
class Instr:
  name: str
  shape: str  # the result's type text, e.g. 'bf16[16,512]{1,0}' or a tuple
  op: str
  rest: str  # operands and attributes


@dataclasses.dataclass
class Computation:
  name: str
  params: dict  # name -> type text
  instrs: list
  fused: bool = False


def _arrays(type_text):
  """[(dtype, dims)] of the arrays in a (possibly tuple) type text."""
  out = []
  for dtype, dims in _ARRAY.findall(re.sub(r'\{[^{}]*\}', '', type_text)):
    if dtype in DTYPE_BYTES:
      out.append((dtype, tuple(int(d) for d in dims.split(',') if d)))
  return out


def parse(text):
  """{name: Computation} and the entry computation's name, from `compiled.as_text()`."""
  comps, entry, cur = {}, None, None
  for line in text.splitlines():
    if cur is None:
      m = _HEADER.match(line.strip())
      if m:
        params = {}
        for part in re.split(r',\s*(?![^\[\]]*\])', m.group(3) or ''):
          if ':' in part:
            k, v = part.split(':', 1)
            params[k.strip().lstrip('%')] = v.strip()
        cur = Computation(m.group(2), params, [])
        if m.group(1):
          entry = cur.name
      continue
    if line.strip() == '}':
      comps[cur.name] = cur
      cur = None
      continue
    m = _INSTR.match(line)
    if m:
      cur.instrs.append(Instr(m.group(2), m.group(3), m.group(4), m.group(5)))
  for comp in comps.values():
    for ins in comp.instrs:
      if ins.op == 'fusion':
        for callee in re.findall(r'calls=%?([\w.\-]+)', ins.rest):
          if callee in comps:
            comps[callee].fused = True
  return comps, entry


def _operands(rest):
  """Operand names of an instruction (before its attributes)."""
  depth = 1
  for i, ch in enumerate(rest):
    depth += ch in '({['
    depth -= ch in ')}]'
    if depth == 0:
      parts = re.split(r',\s*(?![^\[\]{}()]*[\]})])', rest[:i])
      return [p.split()[-1].lstrip('%') for p in parts if p.strip()]
  return []


def _attr(rest, key):
  m = re.search(key + r'=\{([0-9,]*)\}', rest)
  return tuple(int(x) for x in m.group(1).split(',') if x) if m else ()


def _matmul_flops(ins, shapes):
  """2 x output elements x contracted size of a dot, ragged-dot or convolution, else 0; a
  ragged-dot whose ragged dimension is contracted (a weight gradient: output [g, ...]) / g."""
  out = _arrays(ins.shape)
  if ins.op not in ('dot', 'ragged-dot', 'convolution') or not out:
    return 0
  out_elems = math.prod(out[0][1])
  ops = _operands(ins.rest)
  if ins.op in ('dot', 'ragged-dot'):
    lhs = _arrays(shapes.get(ops[0], '')) if ops else []
    dims = _attr(ins.rest, 'lhs_contracting_dims')
    contract = math.prod(lhs[0][1][d] for d in dims) if lhs else 1
    ragged = _attr(ins.rest, 'lhs_ragged_dims')
    if ins.op == 'ragged-dot' and ragged and ragged[0] in dims and len(ops) > 2:
      sizes = _arrays(shapes.get(ops[2], ''))  # the group sizes [..., g]
      return 2 * out_elems * contract // (sizes[0][1][-1] if sizes and sizes[0][1] else 1)
    return 2 * out_elems * contract
  labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', ins.rest)
  rhs = _arrays(shapes.get(ops[1], '')) if len(ops) > 1 else []
  if not labels or not rhs:
    return 0
  contract = math.prod(size for label, size in zip(labels.group(2), rhs[0][1]) if label != 'o')
  groups = re.search(r'feature_group_count=(\d+)', ins.rest)
  return 2 * out_elems * contract // (int(groups.group(1)) if groups else 1)


def meshes(text):
  """{mesh name: {axis: size}} of a lowered program's Shardy meshes (its module header)."""
  header = text.split('\n', 1)[0]
  return {
      name: {
          a: int(n) for a, n in re.findall(r'\\?"([\w.\-]+)\\?"\s*=\s*(\d+)', axes)
      } for name, axes in re.findall(r'([\w.\-]+) = #sdy\.mesh<\[(.*?)\]', header)
  }


def _manual_shards(caller, ins, mesh_sizes):
  """The shards of a shard_map body called by ``ins``: the product of its manual axes' sizes,
  read from the `xla.sdy.GlobalToLocalShape` custom-call its operands come from (1 if none)."""
  by_name = {i.name: i for i in caller.instrs}
  for name in _operands(ins.rest):
    src = by_name.get(name)
    if src is not None and src.op == 'get-tuple-element':
      src = by_name.get((_operands(src.rest) or [''])[0])
    if src is None or 'GlobalToLocalShape' not in src.rest:
      continue
    axes = re.search(r'manual_axes\{(.*?)\}', src.rest)
    mesh = re.search(r'<@([\w.\-]+)', src.rest)
    sizes = mesh_sizes.get(mesh.group(1), {}) if mesh else {}
    names = re.findall(r'[\w.\-]+', axes.group(1).replace('\\"', ' ')) if axes else []
    return math.prod(sizes.get(a, 1) for a in names)
  return 1


def _trip_count(comps, caller, ins):
  """The trip count of a `while` instruction whose condition is counter < constant, or None."""
  cond = re.search(r'condition=%?([\w.\-]+)', ins.rest)
  cond = comps.get(cond.group(1)) if cond else None
  if cond is None or not cond.instrs:
    return None
  by_name = {i.name: i for i in cond.instrs}
  root = cond.instrs[-1]
  ops = _operands(root.rest)
  if root.op != 'compare' or 'direction=LT' not in root.rest or len(ops) != 2:
    return None
  bound, counter = by_name.get(ops[1]), by_name.get(ops[0])
  if bound is None or bound.op != 'constant' or counter is None:
    return None
  limit = int(re.match(r'(-?\d+)', bound.rest).group(1))
  index = re.search(r'index=(\d+)', counter.rest)
  start = 0
  init = {i.name: i for i in caller.instrs}.get((_operands(ins.rest) or [''])[0])
  if index and init is not None and init.op == 'tuple':
    elems = _operands(init.rest)
    src = {
        i.name: i for i in caller.instrs
    }.get(elems[int(index.group(1))]) if int(index.group(1)) < len(elems) else None
    if src is not None and src.op == 'constant':
      start = int(re.match(r'(-?\d+)', src.rest).group(1))
  return max(limit - start, 0)


@dataclasses.dataclass
class Costs:
  """Per-chip costs of one run of a compiled program, loops counted as often as they run."""
  flops: float = 0.0
  hbm_bytes: float = 0.0  # set by the caller (`planner.stage_costs`)
  collective_bytes: dict = dataclasses.field(
      default_factory=lambda: dict.fromkeys(COLLECTIVES, 0.0))
  unknown_loops: int = 0  # while loops whose trip count came from ``unknown_trips``

  @property
  def total_collective_bytes(self):
    return sum(self.collective_bytes.values())


def program_costs(text, unknown_trips=(), trip_counts=True):
  """`Costs` of the HLO ``text``; ``unknown_trips[d]`` is the trip count of a non-constant loop
  at depth d among such loops (1 past the end of the tuple). ``trip_counts=False`` counts every
  loop body once, as XLA's `cost_analysis()` does (the tests' known negative)."""
  comps, entry = parse(text)
  mesh_sizes = meshes(text)
  mult = collections.defaultdict(float)
  costs = Costs()
  seen_channels = {}

  def visit(name, m, depth):
    comp = comps[name]
    mult[name] += m
    shapes = dict(comp.params)
    shapes.update({i.name: i.shape for i in comp.instrs})
    for ins in comp.instrs:
      costs.flops += m * _matmul_flops(ins, shapes)
      base = ins.op[:-len('-start')] if ins.op.endswith('-start') else ins.op
      if base in COLLECTIVES:
        channel = re.search(r'channel_id=(\d+)', ins.rest)
        key = channel.group(1) if channel else (name, ins.name)
        if base == 'all-to-all':  # XLA:CPU gives a shard_map's all-to-alls one channel
          key = (name, ins.name)
        out = _arrays(ins.shape)
        if base == 'all-to-all':  # a tuple of one buffer per peer (`jtc.models.moe_dispatch`)
          out = [(dtype, (sum(math.prod(d) for _, d in out),)) for dtype, _ in out[:1]]
        nbytes = (DTYPE_BYTES[out[-1][0]] * math.prod(out[-1][1])) if out else 0
        if key not in seen_channels:
          seen_channels[key] = True
          costs.collective_bytes[base] += m * nbytes
      if ins.op == 'while':
        body = re.search(r'body=%?([\w.\-]+)', ins.rest).group(1)
        trips = _trip_count(comps, comp, ins)
        d = depth
        if trips is None:
          costs.unknown_loops += 1
          trips = unknown_trips[depth] if depth < len(unknown_trips) else 1
          d = depth + 1
        visit(body, m * trips if trip_counts else m, d)
      else:
        for callee in re.findall(r'(?:calls|to_apply|branch_computations)=\{?%?([\w.\-]+)',
                                 ins.rest):
          if callee in comps and not ins.op.startswith(
              ('all-reduce', 'reduce', 'sort', 'map', 'scatter', 'select-and-scatter')):
            shards = (_manual_shards(comp, ins, mesh_sizes)
                      if callee.startswith('xla.sdy.manual_computation_body') else 1)
            visit(callee, m * shards, depth)

  visit(entry, 1.0, 0)
  return costs
