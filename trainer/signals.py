"""Graceful stop: SIGTERM and SIGINT become a stop request the training
loop sees between two steps, even inside a loop of steps_per_loop steps.

Python runs a signal handler only when the main thread is back in the
interpreter, which a tf.function running hundreds of steps is not. So the
C-level handler's wakeup byte (signal.set_wakeup_fd) wakes a watcher
thread, which sets a tf.Variable at once; the training loop's while_loop
condition reads that variable before every step. A second signal while
stopping takes the default action (the process ends; the checkpoints on
disk are whole either way).
"""

import os
import signal
import threading
import types
from typing import Dict, Optional, Sequence

import tensorflow as tf

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
  """Within `with GracefulStop(flag) as stop:`, the first SIGTERM or SIGINT
  sets `flag` (a boolean tf.Variable) and stop.signum."""

  def __init__(self, flag: tf.Variable,
               signums: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
    self.flag = flag
    self.signums = tuple(signums)
    self.signum: Optional[int] = None
    self._previous: Dict[int, object] = {}
    self._previous_wakeup = -1
    self._read_end = self._write_end = -1
    self._watcher: Optional[threading.Thread] = None

  def __enter__(self) -> 'GracefulStop':
    self._read_end, self._write_end = os.pipe()
    os.set_blocking(self._write_end, False)
    self._watcher = threading.Thread(target=self._Watch, name='graceful_stop',
                                     daemon=True)
    self._watcher.start()
    self._previous_wakeup = signal.set_wakeup_fd(self._write_end,
                                                 warn_on_full_buffer=False)
    for signum in self.signums:
      self._previous[signum] = signal.signal(signum, self._Handle)
    return self

  def __exit__(self, *unused_exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)  # type: ignore[arg-type]
    signal.set_wakeup_fd(self._previous_wakeup)
    os.close(self._write_end)  # ends the watcher's read
    if self._watcher is not None:
      self._watcher.join(timeout=5)
    os.close(self._read_end)

  def _Watch(self) -> None:
    """Sets the flag the moment a stop signal's wakeup byte arrives."""
    while True:
      try:
        data = os.read(self._read_end, 64)
      except OSError:
        return
      if not data:
        return
      if any(b in self.signums for b in data):
        self.flag.assign(True)

  def _Handle(self, signum: int, unused_frame: Optional[types.FrameType]) -> None:
    """The Python-level handler: records the signal (the watcher has set the
    flag already) and lets a second signal end the process at once."""
    if self.signum is None:
      self.signum = signum
    self.flag.assign(True)
    for other in self.signums:
      signal.signal(other, signal.SIG_DFL)
