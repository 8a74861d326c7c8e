"""Checks the top-level Bazel BUILD file against the source tree and its imports.

Bazel cannot run offline here (see docs/design.md), so this test keeps BUILD honest:
every Python file has a target, every src exists, every dep is defined, deps
cover the imports of the srcs, there are no dependency cycles, and programs
and tests have the right rule.
"""

import ast
import dataclasses
import pathlib
import sys
from typing import Dict, Iterator, List, Optional, Set

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = ('lingvo_pipe', 'model_params', 'trainer', 'tests', 'benchmarks', 'tools')
RULES = ('py_library', 'py_test', 'py_binary')
# Top-level import name -> Bazel label of the pip package that provides it.
THIRD_PARTY = {
    'absl': '@pypi//absl_py',
    'hypothesis': '@pypi//hypothesis',
    'lingvo': '@pypi//lingvo',  # only benchmarks/lingvo_peer, run in its own venv
    'matplotlib': '@pypi//matplotlib',
    'numpy': '@pypi//numpy',
    'pytest': '@pypi//pytest',
    'tensorflow': '@pypi//tensorflow',
}
CONFTEST_TARGET = ':tests/conftest'


@dataclasses.dataclass
class Target:
  rule: str
  name: str
  srcs: List[str]
  deps: List[str]
  attrs: dict
  line: int


def ParseBuild(text: str) -> Dict[str, Target]:
  """Returns the rule targets of a BUILD file by name.

  Raises:
    ValueError: on a statement other than load(), package() or a rule call
      with literal keyword arguments, or on a duplicate target name.
  """
  targets: Dict[str, Target] = {}
  for stmt in ast.parse(text, filename='BUILD').body:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
      raise ValueError(f'BUILD line {stmt.lineno}: only load(), package() and '
                       f'{", ".join(RULES)} calls are supported.')
    if call.func.id in ('load', 'package'):
      continue
    if call.func.id not in RULES or call.args:
      raise ValueError(f'BUILD line {stmt.lineno}: {call.func.id}() is not one '
                       f'of {RULES} called with keyword arguments.')
    try:
      attrs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except ValueError:
      raise ValueError(f'BUILD line {stmt.lineno}: attribute values must be '
                       'literals (strings, lists, bools).') from None
    name = attrs.get('name')
    if name in targets:
      raise ValueError(f'BUILD line {stmt.lineno}: target {name!r} is already '
                       f'defined on line {targets[name].line}.')
    targets[name] = Target(call.func.id, name, attrs.get('srcs', []),
                           attrs.get('deps', []), attrs, stmt.lineno)
  return targets


def PythonFiles() -> List[str]:
  """Repository-relative paths of every .py file under SOURCE_DIRS."""
  return sorted(str(p.relative_to(ROOT)) for d in SOURCE_DIRS
                for p in (ROOT / d).rglob('*.py')
                if '__pycache__' not in p.parts)


def IsTestFile(path: str) -> bool:
  return path.startswith('tests/') and pathlib.PurePath(path).name.startswith(
      'test_')


def TestTargetName(path: str) -> str:
  """tests/core/test_linear.py -> tests/core/linear_test (Lingvo's naming).

  A target named test_* would make the pytest runner that aspect_rules_py
  generates (<name>.pytest_main.py) match pytest's test_*.py pattern.
  """
  p = pathlib.PurePath(path)
  return str(p.parent / f'{p.stem[len("test_"):]}_test')


def IsProgram(path: str) -> bool:
  """True if the file has a top-level `if __name__ == '__main__':` block."""
  tree = ast.parse((ROOT / path).read_text(), filename=path)
  return any(
      isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and
      ast.unparse(node.test).replace('"', "'") == "__name__ == '__main__'"
      for node in tree.body)


def ConsoleScriptFiles() -> List[str]:
  """Existing files of the modules named by setup.py's console_scripts."""
  tree = ast.parse((ROOT / 'setup.py').read_text(), filename='setup.py')
  files = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Dict):
      for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and key.value == 'console_scripts':
          for spec in ast.literal_eval(value):
            module = spec.split('=', 1)[1].split(':', 1)[0].strip()
            files.append(_ModuleFile(module))
  return sorted(f for f in files if f)


def _ModuleFile(module: str) -> Optional[str]:
  base = ROOT.joinpath(*module.split('.'))
  for candidate in (base.with_suffix('.py'), base / '__init__.py'):
    if candidate.is_file():
      return str(candidate.relative_to(ROOT))
  return None


def Imports(path: str) -> Iterator[str]:
  """Yields the modules a file imports (anywhere in it), absolute names."""
  tree = ast.parse((ROOT / path).read_text(), filename=path)
  package = '.'.join(pathlib.PurePath(path).parent.parts)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parent = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join(parent + ([base] if base else []))
      for alias in node.names:
        submodule = f'{base}.{alias.name}'
        yield submodule if _ModuleFile(submodule) else base


def _Closure(targets: Dict[str, Target], name: str) -> Set[str]:
  seen, todo = set(), [name]
  while todo:
    current = todo.pop()
    if current in seen or current not in targets:
      continue
    seen.add(current)
    todo.extend(d[1:] for d in targets[current].deps if d.startswith(':'))
  return seen


@pytest.fixture(scope='module', name='targets')
def _Targets() -> Dict[str, Target]:
  return ParseBuild((ROOT / 'BUILD').read_text())


@pytest.fixture(scope='module', name='owner')
def _Owner(targets) -> Dict[str, str]:
  """Source path -> name of the target whose srcs hold it."""
  return {src: t.name for t in targets.values() for src in t.srcs}


def test_every_python_file_has_exactly_one_target(targets):
  listed = [src for t in targets.values() for src in t.srcs]
  missing = sorted(set(PythonFiles()) - set(listed))
  assert not missing, ('Python files without a BUILD target (add a py_library, '
                       f'or a py_test for tests/**/test_*.py): {missing}')
  twice = sorted({src for src in listed if listed.count(src) > 1})
  assert not twice, f'Files in the srcs of more than one target: {twice}'


def test_srcs_and_data_exist(targets):
  absent = [(t.name, f) for t in targets.values()
            for f in t.srcs + t.attrs.get('data', []) + [t.attrs.get('main', '')]
            if f and not (ROOT / f).is_file()]
  assert not absent, f'BUILD names files that do not exist: {absent}'


def test_each_target_has_a_name_and_srcs(targets):
  bad = [t.line for t in targets.values() if not t.name or not t.srcs]
  assert not bad, f'Targets without name or srcs on BUILD lines {bad}'


def test_test_files_are_pytest_targets(targets, owner):
  problems = []
  for path in filter(IsTestFile, PythonFiles()):
    target = targets.get(owner.get(path))
    if target is None:
      continue  # Reported by test_every_python_file_has_exactly_one_target.
    expected = dict(rule='py_test', name=TestTargetName(path), srcs=[path],
                    pytest_main=True)
    actual = dict(rule=target.rule, name=target.name, srcs=target.srcs,
                  pytest_main=target.attrs.get('pytest_main'))
    if actual != expected:
      problems.append(f'{path}: want {expected}, have {actual}')
    for dep in (CONFTEST_TARGET, THIRD_PARTY['pytest']):
      if dep not in target.deps:
        problems.append(f'{target.name}: deps lack {dep!r}')
  others = [t.name for t in targets.values() if t.rule == 'py_test' and
            not all(IsTestFile(s) for s in t.srcs)]
  assert not problems and not others, (problems, others)


def test_programs_are_binaries(targets, owner):
  """A module with an `if __name__ == '__main__':` block, or one that setup.py
  names as a console script (the trainer), is the main of a py_binary."""
  problems = [f'{path} is a console script in setup.py but has no '
              "`if __name__ == '__main__':` block for its py_binary to run"
              for path in ConsoleScriptFiles() if not IsProgram(path)]
  for path in sorted(set(filter(IsProgram, PythonFiles())) |
                     set(ConsoleScriptFiles())):
    target = targets.get(owner.get(path))
    if target and (target.rule, target.attrs.get('main')) != ('py_binary', path):
      problems.append(f'{path} is a program: give it a py_binary with '
                      f"main = {path!r}")
  assert not problems, problems


def test_deps_are_defined(targets):
  unknown = [(t.name, d) for t in targets.values() for d in t.deps
             if not (d.startswith(':') and d[1:] in targets) and
             d not in THIRD_PARTY.values()]
  assert not unknown, ('Deps that are neither BUILD targets nor labels in '
                       f'THIRD_PARTY: {unknown}')


def test_deps_cover_imports(targets, owner):
  """Every import of a target's srcs is in its srcs or its direct deps."""
  problems = []
  for target in targets.values():
    provided = set(target.srcs)
    for dep in target.deps:
      if dep.startswith(':') and dep[1:] in targets:
        provided.update(targets[dep[1:]].srcs)
    for src in filter(lambda s: (ROOT / s).is_file(), target.srcs):
      for module in Imports(src):
        top = module.split('.')[0]
        if top in SOURCE_DIRS:
          path = _ModuleFile(module)
          if path is None:
            problems.append(f'{src} imports {module}, which is no file')
          elif path not in owner:
            problems.append(f'{path} (imported by {src}) has no target')
          elif path not in provided:
            problems.append(f'{target.name}: add ":{owner[path]}" to deps '
                            f'({src} imports {module})')
        elif top not in sys.stdlib_module_names:
          label = THIRD_PARTY.get(top)
          if label is None:
            problems.append(f'{src} imports {top}: add its pip label to '
                            'THIRD_PARTY in tests/test_build_file.py')
          elif label not in target.deps:
            problems.append(f'{target.name}: add "{label}" to deps ({src})')
  assert not problems, '\n'.join(sorted(set(problems)))


def test_packages_come_with_their_init_files(targets):
  """Importing a.b.c runs a/__init__.py and a/b/__init__.py: they are deps."""
  problems = []
  for target in targets.values():
    reachable = {src for name in _Closure(targets, target.name)
                 for src in targets[name].srcs}
    for src in target.srcs:
      for parent in pathlib.PurePath(src).parents:
        init = parent / '__init__.py'
        if str(parent) != '.' and (ROOT / init).is_file() and (
            str(init) not in reachable):
          problems.append(f'{target.name}: {init} is not in its transitive deps')
  assert not problems, problems


def test_no_dependency_cycles(targets):
  for name in targets:
    for dep in targets[name].deps:
      if dep.startswith(':') and name in _Closure(targets, dep[1:]):
        pytest.fail(f'Dependency cycle through {name!r} and {dep!r}; put the '
                    'modules that import each other in one target.')


@pytest.mark.parametrize('text,message', [
    ('x = 1', r'line 1: only load\(\), package\(\)'),
    ('cc_library(name = "a", srcs = ["a.cc"])', r'cc_library\(\) is not one of'),
    ('py_library("a")', r'py_library\(\) is not one of'),
    ('py_library(name = "a", srcs = glob(["*.py"]))', r'must be literals'),
    ('py_library(name = "a", srcs = ["a.py"])\npy_test(name = "a", srcs = [])',
     r"line 2: target 'a' is already defined on line 1"),
])
def test_parse_build_rejects_what_it_cannot_check(text, message):
  with pytest.raises(ValueError, match=message):
    ParseBuild(text)


def test_parse_build_reads_targets():
  targets = ParseBuild('load("@x//y:z.bzl", "py_library")\n'
                       'package(default_visibility = ["//visibility:public"])\n'
                       'py_library(\n    name = "a",\n    srcs = ["a.py"],\n'
                       '    deps = [":b", "@pypi//numpy"],\n)\n')
  assert list(targets) == ['a']
  assert targets['a'] == Target('py_library', 'a', ['a.py'],
                                [':b', '@pypi//numpy'],
                                {'name': 'a', 'srcs': ['a.py'],
                                 'deps': [':b', '@pypi//numpy']}, 3)


def test_imports_resolve_modules_and_names():
  imports = set(Imports('lingvo_pipe/core/layers/containers.py'))
  assert 'lingvo_pipe.core.base_layer' in imports       # from pkg import module
  assert 'lingvo_pipe.core.nested_map' in imports       # from module import name
  assert 'tensorflow' in imports
  lazy = set(Imports('lingvo_pipe/profiling/record.py'))
  assert 'lingvo_pipe.profiling.gantt' in lazy          # import inside a function


def test_console_script_files():
  # setup.py names trainer.trainer and trainer.checkpointing.checkpoint_tool: each counts
  # once its file exists.
  expected = [f for f in ('trainer/checkpointing/checkpoint_tool.py', 'trainer/trainer.py')
              if (ROOT / f).is_file()]
  assert ConsoleScriptFiles() == expected


def test_test_target_name():
  assert TestTargetName('tests/core/test_linear.py') == 'tests/core/linear_test'
  assert TestTargetName('tests/test_build_file.py') == 'tests/build_file_test'
