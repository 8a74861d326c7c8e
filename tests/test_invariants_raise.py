"""The library's invariants raise errors with a message: no `assert`
statement in lingvo_pipe/ or trainer/, which `python -O` would remove."""

import ast

from tests import fresh_process


def test_no_assert_statements_in_the_library():
  found = []
  for package in ('lingvo_pipe', 'trainer'):
    for path in sorted((fresh_process.ROOT / package).rglob('*.py')):
      for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assert):
          found.append(f'{path.relative_to(fresh_process.ROOT)}:{node.lineno}')
  assert not found, f'assert statements (raise an error with a message instead): {found}'
