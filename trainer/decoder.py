"""--mode=decode: a task's decoder on the newest checkpoint (Lingvo's decoder
job). Decodes trainer.decode_steps batches of the dev split (or
--decode_prompt) with a progress line, writes the output to
logdir/decode_<step>.txt (decode_<step>_prompt.txt for a prompt; a file that
exists already is never overwritten: the next free decode_<step>-<n>.txt is
taken), the task's metrics (e.g. BLEU) to TensorBoard under logdir/decode
and to the console."""

import itertools
import os
import time
from typing import Callable, Dict, Iterable, List, Optional

import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks import decoding
from trainer import step_hooks

# Examples printed on the console per decode.
_SHOWN_EXAMPLES = 3
# Seconds between two progress lines (the first batch always gets one).
_PROGRESS_EVERY_S = 5.0


class NoDecoderError(ValueError):
  """The experiment's task cannot decode."""


def CheckCanDecode(params: hyperparams.Params, model: str) -> None:
  """Raises NoDecoderError unless the experiment's task implements
  decoding.DecodingTask (checked on the params, before any work)."""
  task_cls = params.task.cls
  if not issubclass(task_cls, decoding.DecodingTask):
    raise NoDecoderError(
        f'Experiment {model!r} has no decoder: its task {task_cls.__name__} does '
        'not implement lingvo_pipe.tasks.decoding.DecodingTask; decode and '
        'export work for the lm, mt and image experiments.')


class DecodeStopped(Exception):
  """should_stop ended a decode; the examples decoded so far were written."""

  def __init__(self, path: str, num_examples: int) -> None:
    super().__init__(f'{num_examples} examples written to {path}')
    self.path = path
    self.num_examples = num_examples


def NewOutputPath(logdir: str, step: int, prompt: bool) -> str:
  """Creates and returns a file name no other decode has taken:
  decode_<step>.txt (decode_<step>_prompt.txt), else decode_<step>-<n>.txt
  with the smallest free n."""
  stem = os.path.join(logdir, f'decode_{step}{"_prompt" if prompt else ""}')
  for n in itertools.count():
    path = f'{stem}.txt' if n == 0 else f'{stem}-{n}.txt'
    try:
      os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
      return path
    except FileExistsError:
      continue
  raise AssertionError('unreachable')


def _Numpy(nest: NestedMap) -> NestedMap:
  return tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, 'numpy') else x, nest)


class Decoder:
  """Decodes with the task of a loop.Trainer; keeps its traced function, so
  decoding every N steps of train_and_eval traces once."""

  def __init__(self, trainer_obj, log: Callable[[str], None] = print) -> None:
    self.trainer = trainer_obj
    self.task = trainer_obj.task
    self.log = log
    if not isinstance(self.task, decoding.DecodingTask):
      raise NoDecoderError(f'Task {type(self.task).__name__} has no decoder.')
    self._decode = self.task.Decoder()
    self.stopped = False

  def _Batches(self, prompt: str) -> Iterable[NestedMap]:
    if prompt:
      return [self.task.PromptBatch(prompt)]
    dataset = self.trainer.params.dev.Instantiate().Dataset()
    steps = self.trainer.tp.decode_steps
    return dataset.take(steps) if steps > 0 else dataset

  def Decode(self, prompt: str = '', should_stop: Callable[[], bool] = lambda: False,
             progress: bool = False) -> List[decoding.DecodedExample]:
    """Decodes --decode_prompt's text, or the dev split (trainer.decode_steps
    batches; 0: all of it). Stops before the next batch once should_stop()
    is true (self.stopped is then set); with progress, logs a line after the
    first batch and then every few seconds."""
    examples: List[decoding.DecodedExample] = []
    self.stopped = False
    steps = 1 if prompt else self.trainer.tp.decode_steps
    start = last = time.perf_counter()
    for i, batch in enumerate(self._Batches(prompt), 1):
      if should_stop():
        self.stopped = True
        break
      with eval_mode.EvalMode():  # traced once, for inference
        decoded = self._decode(batch)
      examples += self.task.PostProcessDecode(_Numpy(batch), _Numpy(decoded))
      now = time.perf_counter()
      if progress and (i == 1 or now - last >= _PROGRESS_EVERY_S or i == steps):
        last = now
        of = f'/{steps}' if steps else ' (the whole split)'
        self.log(f'decode: batch {i}{of}, {len(examples)} examples, '
                 f'{now - start:.1f} s')
    if self.stopped:
      return examples
    if not examples:
      raise ValueError('The dev input produced no batch to decode; check its '
                       'data and batch_size.')
    return examples

  def Run(self, prompt: str = '', should_stop: Optional[Callable[[], bool]] = None,
          progress: bool = False) -> Dict[str, float]:
    """Decodes, writes the output to a new file (NewOutputPath) and the
    metrics; returns them.

    Raises:
      DecodeStopped: should_stop() ended the decode; what was decoded is
        written (no metrics).
    """
    step = int(self.trainer.global_step.numpy())
    examples = self.Decode(prompt, should_stop or (lambda: False), progress)
    path = NewOutputPath(self.trainer.logdir, step, bool(prompt))
    with open(path, 'w', encoding='utf-8') as f:
      f.write(self.task.FormatDecoded(examples))
    if self.stopped:
      raise DecodeStopped(path, len(examples))
    metrics = self.task.DecodeMetrics(examples)
    writer = self.trainer._Writer('decode')  # pylint: disable=protected-access
    with writer.as_default(step=step):
      for key, value in metrics.items():
        tf.summary.scalar(key, value)
    writer.flush()
    for example in examples[:_SHOWN_EXAMPLES]:
      self.log(f'  input:     {example.source!r}\n  output:    {example.output!r}'
               + (f'\n  reference: {example.reference!r}'
                  if example.reference is not None else ''))
    summary = '  '.join(f'{k} {v:.2f}' for k, v in sorted(metrics.items()))
    shown = min(len(examples), _SHOWN_EXAMPLES)
    where = (f'{shown} shown above, all in {path}' if shown < len(examples)
             else f'all shown above, and in {path}')
    self.log(f'decode at step {step}: {len(examples)} examples  {summary}'.rstrip()
             + f'  ({where})')
    return metrics


def EveryNSteps(trainer_obj, interval: int) -> step_hooks.EveryNSteps:
  """An after_loop hook of loop.Trainer.Train that decodes when the global
  step has passed a multiple of `interval` since the last decode."""
  return step_hooks.EveryNSteps(trainer_obj.global_step, interval, Decoder(trainer_obj).Run)


def PrintSample(trainer_obj, num_bytes: int, log: Callable[[str], None] = print) -> None:
  """Prints a sampled continuation of a held-out window (the end of a
  language model's train_and_eval); other tasks print nothing."""
  task = trainer_obj.task
  if not hasattr(task, 'Sample'):
    return
  batch = next(iter(trainer_obj.params.dev.Instantiate().Dataset()))
  prompt = batch.ids.numpy()[:1]
  sample = task.Sample(prompt, num_bytes, seed=trainer_obj.tp.seed)
  log(f'--- prompt (last 80 bytes) ---\n{decoding.Text(prompt[0])[-80:]}\n'
      f'--- sample ---\n{decoding.Text(sample[0])}\n---')
