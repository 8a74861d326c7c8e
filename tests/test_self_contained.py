"""The repository stands on its own: no tracked file points outside it.

A user who clones the project must be able to read every document and run
every command it names, so code, tests, docs, Makefile and BUILD may not
refer to notes or harnesses kept beside the repository (the design, the
workloads and the Lingvo peer live in docs/ and benchmarks/lingvo_peer/).

The rules are general, so that this file names no outside path itself, and
they judge only the repository's own text: the same tree gets the same
verdict wherever it is cloned and whatever lies beside the clone.
- every markdown file a tracked file names is one the repository tracks;
- no relative path climbs out of the repository ('../notes/x' from the
  repository's top; '../..' from a file two directories down stays inside);
- an absolute path names a place of the operating system (/tmp, /usr, /proc,
  ...), never a home or work directory where notes might be kept, and never
  leads into a checkout (names this checkout's directory, or ends in a
  tracked path of two or more components, or a directory of one);
- relative markdown links stay inside the repository and resolve.
"""

import pathlib
import re
import subprocess
from typing import Collection, List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
THIS_FILE = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()

# A markdown file name, with the path before it if any: 'docs/design.md'.
MARKDOWN_NAME = re.compile(r'(?<![\w.-])[\w./-]*\w\.md\b')
# A path of two or more components, relative or absolute: 'a/b', '/a/b'; the
# character before it, if any, tells whether a leading '/' starts an absolute
# path ('cd /a/b') or joins it to what precedes ('$(dirname "$0")/../..').
PATH = re.compile(r'(?<![\w.~-])/?[\w.~-]+(?:/[\w.~-]+)+')
# What may stand before an absolute path: nothing, a space, a quote, '=', ...
ABSOLUTE_START = set(' \t\'"`=(,:[{')
# Top directories of an absolute path that belong to the operating system
# (and '/path/to/...', the placeholder of usage lines); any other absolute
# path names somebody's machine ('/.ATTRIBUTES/...', a key suffix, none).
SYSTEM_ROOTS = frozenset({'tmp', 'usr', 'bin', 'sbin', 'lib', 'proc', 'dev', 'sys',
                          'etc', 'var', 'opt', 'path'})
# Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


class Repository:
  """What a tracked file may name: the repository's markdown files, paths
  and top-level entries. Built from the list of tracked files alone."""

  def __init__(self, root: pathlib.Path, tracked: Collection[str]) -> None:
    self.root = root
    self.markdown = {pathlib.PurePath(p).name for p in tracked if p.endswith('.md')}
    self.top_level = {pathlib.PurePath(p).parts[0] for p in tracked}
    self.paths = {str(d) for p in tracked
                  for d in [pathlib.PurePath(p), *pathlib.PurePath(p).parents]
                  if len(d.parts) > 1}

  def OutsideReferences(self, path: str, text: str) -> List[str]:
    """'path:line: why: the line' for each mention of a path outside it."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
      for why in self._Why(path, line):
        found.append(f'{path}:{number}: {why}: {line.strip()[:160]}')
    return found

  def _Why(self, path: str, line: str) -> List[str]:
    whys = [f'{name} is no markdown file of the repository'
            for name in MARKDOWN_NAME.findall(line)
            if pathlib.PurePath(name).name not in self.markdown]
    for match in PATH.finditer(line):
      token, before = match.group(), line[max(match.start() - 1, 0):match.start()]
      absolute = token.startswith('/') and before in ABSOLUTE_START | {''}
      parts = [p for p in token.split('/') if p not in ('', '.')]
      if not absolute:
        if _Climbs(pathlib.PurePosixPath(path).parent.parts, parts):
          whys.append(f'{token} climbs out of the repository')
      elif self.root.name in parts or any(
          '/'.join(parts[i:]) in self.paths for i in range(1, len(parts) - 1)):
        whys.append(f'{token} is an absolute path into a checkout')
      elif parts[0] not in SYSTEM_ROOTS and not parts[0].startswith('.'):
        whys.append(f'{token} names a place outside the repository and the '
                    'operating system')
    return whys

  def BrokenLinks(self, path: str, text: str) -> List[str]:
    """Relative markdown links that leave the repository or name no file."""
    found = []
    for target in LINK.findall(text):
      if re.match(r'[a-z]+:', target) or target.startswith('#'):
        continue  # a URL or an anchor on the same page
      resolved = ((self.root / path).parent / target.split('#')[0]).resolve()
      if not resolved.is_relative_to(self.root):
        found.append(f'{path}: {target} leaves the repository')
      elif not resolved.exists():
        found.append(f'{path}: {target} does not exist')
    return found


def _Climbs(start: Tuple[str, ...], parts: List[str]) -> bool:
  """Whether following parts ('..' climbs) from directory start (a tuple of
  repository-relative components) leaves the repository."""
  depth = len(start)
  for part in parts:
    depth += -1 if part == '..' else 1
    if depth < 0:
      return True
  return False


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


@pytest.fixture(name='tracked', scope='module')
def _Tracked() -> List[Tuple[str, str]]:
  return _TrackedTextFiles()


def test_no_tracked_file_refers_outside_the_repository(tracked):
  repo = Repository(ROOT, [path for path, _ in tracked])
  found = [ref for path, text in tracked if path != THIS_FILE
           for ref in repo.OutsideReferences(path, text)]
  assert not found, '\n'.join(found)


def test_markdown_links_stay_inside_and_resolve(tracked):
  repo = Repository(ROOT, [path for path, _ in tracked])
  found = [ref for path, text in tracked if path.endswith('.md')
           for ref in repo.BrokenLinks(path, text)]
  assert not found, '\n'.join(found)


@pytest.fixture(name='repo')
def _Repo(tmp_path) -> Repository:
  """A checkout 'proj' with README.md and docs/, and 'notes/' beside it."""
  root = tmp_path / 'proj'
  (root / 'docs').mkdir(parents=True)
  (root / 'README.md').write_text('')
  (tmp_path / 'notes' / 'peers').mkdir(parents=True)
  return Repository(root, ['README.md', 'docs/design.md', 'lib/a.py'])


@pytest.mark.parametrize('line', [
    'see ../notes/PLAN.md', 'cd ../notes/peers/x && bash setup.sh',
    'the workloads of notes/PLAN.md', 'placement (PLAN.md)',
    'python /home/dev/notes/peers/x/bench.py', 'python /srv/proj/lib/a.py',
    'cd /srv/proj', 'notes in /mnt/notes/peers', 'python ../notes/bench.py',
])
def test_outside_references_are_found(repo, line):
  found = repo.OutsideReferences('x.py', f'ok\n{line}\n')
  assert found and all(f.startswith('x.py:2: ') for f in found), found


@pytest.mark.parametrize('line', [
    'see docs/design.md and README.md', 'python -m lib.a', 'lib/a.py, docs/',
    'default /tmp/peer-venv', 'x.endswith(".md")', 'logs in /tmp/lib/<model>',
    '#!/usr/bin/env bash', "'<attribute>/a/b/w/.ATTRIBUTES/VARIABLE_VALUE'",
    'PEER_VENV=/path/to/venv bash setup.sh',
])
def test_inside_references_pass(repo, line):
  assert repo.OutsideReferences('x.py', line) == []


def test_climbing_is_judged_from_the_file(repo):
  line = 'cd "$(dirname "$0")/../.."'
  assert repo.OutsideReferences('lib/sub/run.sh', line) == []
  assert repo.OutsideReferences('lib/run.sh', line) != []


def test_verdict_does_not_depend_on_what_lies_beside(tmp_path):
  """The Makefile's own comment naming a default venv in /tmp passes,
  whether or not that venv (or anything else) sits next to the clone."""
  line = 'its venv is built at PEER_VENV, default /tmp/lingvo-peer-venv'
  verdicts = []
  for beside in ([], ['lingvo-peer-venv', 'notes', 'tmp']):
    root = tmp_path / str(len(beside)) / 'proj'
    root.mkdir(parents=True)
    for name in beside:
      (root.parent / name).mkdir()
    repo = Repository(root, ['README.md', 'Makefile', 'lib/a.py'])
    verdicts.append(repo.OutsideReferences('Makefile', line))
  assert verdicts == [[], []]


def test_links_that_leave_or_miss_are_found(repo):
  text = ('[a](../README.md) [b](../../x.md) [c](#top) [d](https://example.com) '
          '![e](nothing.png) [f](../README.md#make)')
  assert repo.BrokenLinks('docs/x.md', text) == [
      'docs/x.md: ../../x.md leaves the repository',
      'docs/x.md: nothing.png does not exist']
