"""Keeps TensorFlow's C++ log lines below a severity off the terminal.

TensorFlow's C++ runtime writes lines such as `I0000 ... port.cc:153]
oneDNN custom operations are on` and, on machines without a GPU,
`E0000 ... failed call to cuInit`, straight to file descriptor 2, some
before TF_CPP_MIN_LOG_LEVEL is read. FilterCppLogs puts a pipe on that
descriptor and a thread that passes every line through except C++ log
lines below the chosen severity; Python's own stderr keeps writing to the
terminal directly, so the program's own messages never wait on the thread.
"""

import atexit
import io
import logging
import os
import re
import sys
import threading
from typing import Any, List, Optional

# Severity letter of a C++ log line (absl/TensorFlow format) -> level, the
# TF_CPP_MIN_LOG_LEVEL scale: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL.
_LEVELS = {'I': 0, 'W': 1, 'E': 2, 'F': 3}
_HEADER = re.compile(rb'^([IWEF])\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ')
_ABSL_PREAMBLE = b'WARNING: All log messages before absl::InitializeLog() is called'


def LineLevel(line: bytes) -> Optional[int]:
  """The severity of a C++ log line (None: not a log line's first line)."""
  match = _HEADER.match(line)
  if match:
    return _LEVELS[match.group(1).decode()]
  if line.startswith(_ABSL_PREAMBLE):
    return _LEVELS['W']
  return None


class _Filter:
  """The pipe on descriptor 2 and the thread that filters it."""

  def __init__(self, min_level: int) -> None:
    self.min_level = min_level
    self.terminal = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    self.read_end = read_end
    self.thread = threading.Thread(target=self._Run, name='quiet_logs', daemon=True)
    self.thread.start()

  def _Run(self) -> None:
    with io.open(self.read_end, 'rb', buffering=0) as pipe:
      pending = b''
      while True:
        chunk = pipe.read(65536)
        if not chunk:
          break
        pending += chunk
        *lines, pending = pending.split(b'\n')
        # A multi-line log message comes in one write: only lines read with
        # its first line continue it (and share its level).
        level: Optional[int] = None
        for line in lines:
          level = self._Pass(line + b'\n', level)
      if pending:
        self._Pass(pending, None)

  def _Pass(self, line: bytes, level: Optional[int]) -> Optional[int]:
    """Writes line unless it is (the continuation of) a quiet log line;
    returns the level that a following continuation line inherits."""
    line_level = LineLevel(line)
    if line_level is not None:
      level = line_level
    if level is None or level >= self.min_level:
      os.write(self.terminal, line)
    return level

  def Close(self) -> None:
    """Puts the terminal back on descriptor 2 and drains the pipe."""
    sys.stderr.flush()
    os.dup2(self.terminal, 2)
    self.thread.join(timeout=5)


def FilterCppLogs(min_level: int) -> None:
  """Hides C++ log lines below min_level (0-3) from now until exit.

  Call it before TensorFlow is imported. Python's sys.stderr then writes
  to the terminal directly (line-buffered).

  Args:
    min_level: 0 shows everything, 3 only FATAL lines.
  """
  if not 0 <= min_level <= 3:
    raise ValueError(f'min_level {min_level} must be 0-3 (the '
                     'TF_CPP_MIN_LOG_LEVEL scale).')
  sys.stderr.flush()
  log_filter = _Filter(min_level)
  old_stderr = sys.stderr
  sys.stderr = io.TextIOWrapper(io.FileIO(os.dup(log_filter.terminal), 'w'),
                                encoding=sys.stderr.encoding,
                                errors='backslashreplace', line_buffering=True)
  # Logging handlers made earlier (absl's) hold the old stream: point them
  # at the terminal too, so only C-level writes pass the filter.
  for handler in _StreamHandlers():
    if getattr(handler, 'stream', None) is old_stderr:
      handler.setStream(sys.stderr)
  atexit.register(log_filter.Close)


def _StreamHandlers() -> List[logging.StreamHandler]:
  """The logging handlers of the root logger and absl's, if absl is used."""
  handlers: List[Any] = list(logging.getLogger().handlers)
  absl_logging = sys.modules.get('absl.logging')
  if absl_logging is not None:
    absl_handler = absl_logging.get_absl_handler()
    handlers += [absl_handler, getattr(absl_handler, 'python_handler', None)]
  return [h for h in handlers if isinstance(h, logging.StreamHandler)]
