"""The repository stands on its own: no tracked file points outside it.

A user who clones the project must be able to read every document and run
every command it names, so code, tests, docs, Makefile and BUILD may not
refer to notes or harnesses kept beside the repository (the design, the
workloads and the Lingvo peer live in docs/ and benchmarks/lingvo_peer/).

The rules are general, so that this file names no outside path itself:
- every markdown file a tracked file names is one the repository tracks;
- no path names a directory that lies beside the repository and not in it
  (read from the file system: whatever sits next to this checkout);
- no absolute path leads into a checkout (names this checkout's directory,
  or ends in a tracked path of two or more components, or a directory of
  one) or beside it;
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
# A path of two or more components, relative or absolute: 'a/b', '/a/b'.
PATH = re.compile(r'(?<![\w.~-])/?[\w.~-]+(?:/[\w.~-]+)+')
# Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


class Repository:
  """What a tracked file may name: the repository's markdown files and
  top-level entries, and what lies beside it."""

  def __init__(self, root: pathlib.Path, tracked: Collection[str]) -> None:
    self.root = root
    self.markdown = {pathlib.PurePath(p).name for p in tracked if p.endswith('.md')}
    self.top_level = {pathlib.PurePath(p).parts[0] for p in tracked}
    self.paths = {str(d) for p in tracked
                  for d in [pathlib.PurePath(p), *pathlib.PurePath(p).parents]
                  if len(d.parts) > 1}
    self.beside = {p.name for p in root.parent.iterdir()
                   if p.name != root.name and p.name not in self.top_level}

  def OutsideReferences(self, path: str, text: str) -> List[str]:
    """'path:line: why: the line' for each mention of a path outside it."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
      for why in self._Why(line):
        found.append(f'{path}:{number}: {why}: {line.strip()[:160]}')
    return found

  def _Why(self, line: str) -> List[str]:
    whys = [f'{name} is no markdown file of the repository'
            for name in MARKDOWN_NAME.findall(line)
            if pathlib.PurePath(name).name not in self.markdown]
    for token in PATH.findall(line):
      parts = [p for p in token.split('/') if p not in ('', '.', '..')]
      if any(p in self.beside for p in parts):
        whys.append(f'{token} names a directory beside the repository')
      elif token.startswith('/') and (self.root.name in parts or any(
          '/'.join(parts[i:]) in self.paths for i in range(1, len(parts) - 1))):
        whys.append(f'{token} is an absolute path into a checkout')
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
    'cd /srv/proj',
])
def test_outside_references_are_found(repo, line):
  found = repo.OutsideReferences('x.py', f'ok\n{line}\n')
  assert found and all(f.startswith('x.py:2: ') for f in found), found


@pytest.mark.parametrize('line', [
    'see docs/design.md and README.md', 'python -m lib.a', 'lib/a.py, docs/',
    'default /tmp/peer-venv', 'x.endswith(".md")', 'logs in /tmp/lib/<model>',
])
def test_inside_references_pass(repo, line):
  assert repo.OutsideReferences('x.py', line) == []


def test_links_that_leave_or_miss_are_found(repo):
  text = ('[a](../README.md) [b](../../x.md) [c](#top) [d](https://example.com) '
          '![e](nothing.png) [f](../README.md#make)')
  assert repo.BrokenLinks('docs/x.md', text) == [
      'docs/x.md: ../../x.md leaves the repository',
      'docs/x.md: nothing.png does not exist']
