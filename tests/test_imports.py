"""No import cycle in the repository: the graph of imports between the modules of jtc/,
experiments/, benchmarks/ and configs/ (top-level and function-local imports alike, read with
`ast`) has no cycle."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('jtc', 'experiments', 'benchmarks', 'configs')


def modules(root, packages):
  """{module name: path} of every .py file under ``root/<package>``."""
  out = {}
  for package in packages:
    for folder, _, files in os.walk(os.path.join(root, package)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          module = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
          out[module.removesuffix('.__init__')] = path
  return out


def _imported(node, module, is_package, mods):
  """The modules an Import / ImportFrom node names: ``from a import b`` names a.b when a.b is a
  module, else a (a package's own __init__, which importing any of its modules runs first, is
  not an edge of its modules); relative imports are resolved against ``module``."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  base = node.module or ''
  if node.level:
    parts = module.split('.')
    parts = parts if is_package else parts[:-1]
    parts = parts[:len(parts) - node.level + 1]
    base = '.'.join(parts + ([base] if base else []))
  return [f'{base}.{a.name}' if f'{base}.{a.name}' in mods else base for a in node.names]


def import_graph(root, packages):
  """{module: set of modules of ``packages`` it imports}, every import statement counted, the
  ones inside functions too."""
  mods = modules(root, packages)
  graph = {}
  for module, path in mods.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        is_package = path.endswith('__init__.py')
        edges |= {m for m in _imported(node, module, is_package, mods) if m in mods and m != module}
    graph[module] = edges
  return graph


def find_cycle(graph):
  """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search)."""
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 'done'
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_a_planted_cycle_through_a_function_local_import_is_found(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('')
  (pkg / 'sub' / '__init__.py').write_text('')
  (pkg / 'a.py').write_text('from pkg.sub import b\n')
  (pkg / 'sub' / 'b.py').write_text('def f():\n  from .. import c\n')
  (pkg / 'c.py').write_text('import pkg.a\n')
  graph = import_graph(str(tmp_path), ['pkg'])
  assert graph['pkg.sub.b'] == {'pkg.c'} and graph['pkg.a'] == {'pkg.sub.b'}
  assert find_cycle(graph) == ['pkg.a', 'pkg.sub.b', 'pkg.c', 'pkg.a']
  (pkg / 'c.py').write_text('import os\n')  # the cycle broken: nothing found
  assert find_cycle(import_graph(str(tmp_path), ['pkg'])) is None


def test_the_repository_has_no_import_cycle():
  graph = import_graph(REPO, PACKAGES)
  assert {'jtc.objectives.loss', 'experiments.report', 'benchmarks.harness',
          'configs.common'} <= set(graph)
  assert 'experiments.common' in graph['experiments.report']  # edges are read
  assert find_cycle(graph) is None, f'import cycle: {" -> ".join(find_cycle(graph))}'
