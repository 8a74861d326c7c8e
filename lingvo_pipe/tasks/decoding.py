"""The decoder interface of a task: what `--mode=decode` and `--mode=export`
call, so that a new task plugs in by implementing these methods."""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap


@dataclasses.dataclass
class DecodedExample:
  """One decoded example, as text: its input, the model's output and, when
  the data has one, the reference output."""
  source: str
  output: str
  reference: Optional[str] = None


class DecodingTask:
  """A mixin of tasks that can decode. The trainer's decoder feeds Decode
  batches of the dev split (or PromptBatch of --decode_prompt), turns its
  outputs into DecodedExamples and their DecodeMetrics."""

  def PromptBatch(self, text: str) -> NestedMap:
    """A batch to decode from user text (one example per line)."""
    raise NotImplementedError(f'{type(self).__name__} must define PromptBatch.')

  def Decode(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    """Decodes a batch in eval mode (no dropout, no gradient): tensors."""
    raise NotImplementedError(f'{type(self).__name__} must define Decode.')

  def Decoder(self) -> Callable[[NestedMap], NestedMap]:
    """What the trainer's decoder calls on each batch: by default Decode
    with the task's variables, traced once."""
    return tf.function(lambda batch: self.Decode(getattr(self, 'theta'), batch),
                       autograph=False)

  def PostProcessDecode(self, batch: NestedMap, decoded: NestedMap) -> List[DecodedExample]:
    """The batch's examples as text; `batch` and `decoded` hold numpy arrays."""
    raise NotImplementedError(f'{type(self).__name__} must define PostProcessDecode.')

  def DecodeMetrics(self, examples: Sequence[DecodedExample]) -> Dict[str, float]:
    """Metrics of all decoded examples (e.g. corpus BLEU); default none."""
    del examples
    return {}

  def FormatDecoded(self, examples: Sequence[DecodedExample]) -> str:
    """The text of logdir/decode_<step>.txt: by default each output on a
    line of its own (line i is dev example i: the form BLEU tools read)."""
    return ''.join(e.output.replace('\n', ' ') + '\n' for e in examples)

  def ServingSignature(self) -> Tuple[Dict[str, tf.TensorSpec], str]:
    """(the inputs of the exported inference function by name, a one-line
    description of what it returns); the function is ServingFunction."""
    raise NotImplementedError(f'{type(self).__name__} must define ServingSignature.')

  def ServingFunction(self, theta: NestedMap, **inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    """The exported inference function: named tensors in and out."""
    raise NotImplementedError(f'{type(self).__name__} must define ServingFunction.')


def Text(ids: Sequence[int], stop_ids: Sequence[int] = ()) -> str:
  """Bytes `ids` as UTF-8 text (invalid bytes replaced), cut at the first
  id in stop_ids."""
  out = []
  for i in ids:
    if int(i) in stop_ids:
      break
    out.append(int(i))
  return bytes(out).decode('utf-8', 'replace')
