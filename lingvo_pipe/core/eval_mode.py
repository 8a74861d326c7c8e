"""Eval mode: whether layers trace their training or inference behaviour."""

import contextlib
import contextvars
from typing import Iterator

_EVAL_MODE = contextvars.ContextVar('lingvo_pipe_eval_mode', default=False)


@contextlib.contextmanager
def EvalMode(is_eval: bool = True) -> Iterator[None]:
  """While active, layers trace their inference behaviour (no dropout, batch
  norm from moving averages). It is read when a graph is traced: a
  tf.function traced in training keeps its training behaviour when called
  inside EvalMode, so trace a separate function for eval."""
  token = _EVAL_MODE.set(is_eval)
  try:
    yield
  finally:
    _EVAL_MODE.reset(token)


def IsEvalMode() -> bool:
  return _EVAL_MODE.get()
