"""The repository stands on its own: no tracked file points outside it.

A user who clones the project must be able to read every document and run
every command it names, so code, tests, docs, Makefile and BUILD may not
refer to notes or harnesses kept beside the repository (the design, the
workloads and the Lingvo peer live in docs/ and benchmarks/lingvo_peer/).
"""

import pathlib
import re
import subprocess
from typing import List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
THIS_FILE = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()

# Paths of notes and harnesses kept beside the repository, never in it.
OUTSIDE = [
    (re.compile(r'\.\./shared\b'), 'a sibling directory of the repository'),
    (re.compile(r'\bshared/(peers|hooks)\b'), 'a harness outside the repository'),
    (re.compile(r'\b(DESIGN|BENCHMARKS|STYLE)\.md\b'),
     'notes outside the repository; use docs/design.md or docs/workloads.md'),
    (re.compile(r'/work/(shared|main|wt)\b'), "a path of the developers' machine"),
]
# Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def _TrackedTextFiles() -> List[Tuple[str, str]]:
  """(path, text) of every tracked file that is UTF-8 text."""
  try:
    listing = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip('not a git checkout: no list of tracked files')
  files = []
  for path in filter(None, listing.split('\0')):
    try:
      text = (ROOT / path).read_text(encoding='utf-8')
    except (UnicodeDecodeError, FileNotFoundError):
      continue  # binary, or deleted in the work tree
    if '\0' not in text:
      files.append((path, text))
  return files


def OutsideReferences(path: str, text: str) -> List[str]:
  """'path:line: why: the line' for each mention of a path outside the repo."""
  found = []
  for number, line in enumerate(text.splitlines(), 1):
    for pattern, why in OUTSIDE:
      if pattern.search(line):
        found.append(f'{path}:{number}: {why}: {line.strip()[:160]}')
  return found


def BrokenLinks(path: str, text: str) -> List[str]:
  """Relative markdown links that leave the repository or name no file."""
  found = []
  for target in LINK.findall(text):
    if re.match(r'[a-z]+:', target) or target.startswith('#'):
      continue  # a URL or an anchor on the same page
    resolved = ((ROOT / path).parent / target.split('#')[0]).resolve()
    if not resolved.is_relative_to(ROOT):
      found.append(f'{path}: {target} leaves the repository')
    elif not resolved.exists():
      found.append(f'{path}: {target} does not exist')
  return found


def test_no_tracked_file_refers_outside_the_repository():
  found = [ref for path, text in _TrackedTextFiles() if path != THIS_FILE
           for ref in OutsideReferences(path, text)]
  assert not found, '\n'.join(found)


def test_markdown_links_stay_inside_and_resolve():
  found = [ref for path, text in _TrackedTextFiles() if path.endswith('.md')
           for ref in BrokenLinks(path, text)]
  assert not found, '\n'.join(found)


@pytest.mark.parametrize('line', [
    'see ../shared/BENCHMARKS.md', 'cd ../shared/peers/lingvo && bash setup.sh',
    'the workloads of shared/BENCHMARKS.md', 'placement (DESIGN.md)',
    'python /work/shared/peers/lingvo/bench.py',
])
def test_outside_references_are_found(line):
  found = OutsideReferences('x.py', f'ok\n{line}\n')
  assert found and all(f.startswith('x.py:2: ') for f in found), found


def test_links_that_leave_or_miss_are_found():
  text = ('[a](../README.md) [b](../../x.md) [c](#top) [d](https://example.com) '
          '![e](nothing.png) [f](../README.md#make)')
  assert BrokenLinks('docs/x.md', text) == [
      'docs/x.md: ../../x.md leaves the repository',
      'docs/x.md: nothing.png does not exist']
