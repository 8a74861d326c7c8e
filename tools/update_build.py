"""Regenerates BUILD from the tree and its imports: python tools/update_build.py.

tests/test_build_file.py checks BUILD; run this after adding or moving a
module, then review the diff.
"""
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location('tbf', ROOT / 'tests/test_build_file.py')
tbf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tbf)

files = tbf.PythonFiles()
def modname(path):
  p = pathlib.PurePath(path)
  parts = list(p.parent.parts) + ([] if p.name == '__init__.py' else [p.stem])
  return '.'.join(parts)

def first_party_deps(path):
  out = set()
  for m in tbf.Imports(path):
    if m.split('.')[0] in tbf.SOURCE_DIRS:
      f = tbf._ModuleFile(m)
      assert f, (path, m)
      out.add(f)
  return out
graph = {f: first_party_deps(f) - {f} for f in files}

# Strongly connected components (Tarjan) so that mutual imports share a target.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def visit(v):
  index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
  for w in sorted(graph[v]):
    if w not in index: visit(w); low[v] = min(low[v], low[w])
    elif w in on: low[v] = min(low[v], index[w])
  if low[v] == index[v]:
    comp = []
    while True:
      w = stack.pop(); on.discard(w); comp.append(w)
      if w == v: break
    sccs.append(sorted(comp))
for f in files:
  if f not in index: visit(f)

def target_name(comp):
  f = comp[0]
  if tbf.IsTestFile(f): return tbf.TestTargetName(f)
  p = pathlib.PurePath(f)
  return str(p.parent) if p.name == '__init__.py' else str(p.with_suffix(''))
owner = {}
comps = {}
for comp in sccs:
  n = target_name(comp)
  comps[n] = comp
  for f in comp: owner[f] = n

def deps_of(name, comp):
  deps = set()
  for f in comp:
    for g in graph[f]:
      if owner[g] != name: deps.add(':' + owner[g])
    for m in tbf.Imports(f):
      top = m.split('.')[0]
      if top not in tbf.SOURCE_DIRS and top not in sys.stdlib_module_names:
        deps.add(tbf.THIRD_PARTY[top])
    # The package that holds the module.
    p = pathlib.PurePath(f)
    pkg_dir = p.parent.parent if p.name == '__init__.py' else p.parent
    init = pkg_dir / '__init__.py'
    if str(pkg_dir) != '.' and (ROOT / init).is_file() and owner[str(init)] != name:
      deps.add(':' + owner[str(init)])
    if tbf.IsTestFile(f):
      deps.add(tbf.CONFTEST_TARGET); deps.add(tbf.THIRD_PARTY['pytest'])
  return sorted(deps, key=lambda d: (d.startswith('@'), d))

def fmt_list(key, items):
  if len(items) == 1:
    return [f'    {key} = ["{items[0]}"],']
  return [f'    {key} = ['] + [f'        "{i}",' for i in items] + ['    ],']

def sort_key(name):
  comp = comps[name]; f = comp[0]
  p = pathlib.PurePath(f)
  is_test = f.startswith('tests/')
  return (is_test, str(p.parent) if p.name != '__init__.py' else str(p.parent), p.name != '__init__.py', name)

out = ['''# Bazel targets of lingvo_pipe, mirroring the tree: a py_library per package
# (its __init__.py) and per module (modules that import each other share one),
# a py_test per tests/**/test_*.py (run by pytest) and a py_binary per program.
#
# Bazel cannot fetch its toolchains offline on the development machines, so CI
# does not run it; tests/test_build_file.py checks this file against the tree
# and the imports instead. Running it needs, in MODULE.bazel, aspect_rules_py
# and a rules_python pip hub named "pypi" (tensorflow, numpy, absl-py, pytest).

load("@aspect_rules_py//py:defs.bzl", "py_binary", "py_library", "py_test")

package(default_visibility = ["//visibility:public"])
''']
section = None
for name in sorted(comps, key=sort_key):
  comp = comps[name]
  f = comp[0]
  d = str(pathlib.PurePath(f).parent)
  if d != section:
    out.append(f'# --- {d}/ ' + '-' * max(0, 70 - len(d)))
    out.append('')
    section = d
  is_program = any(tbf.IsProgram(x) or x in tbf.ConsoleScriptFiles() for x in comp)
  if tbf.IsTestFile(f): rule = 'py_test'
  elif is_program: rule = 'py_binary'
  else: rule = 'py_library'
  lines = [f'{rule}(', f'    name = "{name}",']
  lines += fmt_list('srcs', comp)
  if rule == 'py_binary':
    lines.append(f'    main = "{f}",')
  if f == 'tests/conftest.py':
    lines += fmt_list('data', ['pytest.ini'])
  if rule == 'py_test':
    lines.append('    pytest_main = True,')
  deps = deps_of(name, comp)
  if deps: lines += fmt_list('deps', deps)
  lines.append(')')
  out.append('\n'.join(lines)); out.append('')
(ROOT / 'BUILD').write_text('\n'.join(out).rstrip() + '\n')
print(len(comps), 'targets;', [c for c in comps.values() if len(c) > 1])
