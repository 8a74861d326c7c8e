"""docs/your_layer.md cannot rot: its Python blocks run, in order, as one
program in a fresh process (its logical devices must be set before
TensorFlow starts), and the messages it quotes in text blocks are the
library's own, made by the mistakes the page describes."""

import subprocess

import pytest

from tests import doc_blocks
from tests import fresh_process

DOC = fresh_process.ROOT / 'docs' / 'your_layer.md'

# Run after the page's program, with its names: each mistake the page
# quotes, and what the library says of it.
_MISTAKES = '''

def _Say(fn):
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    print(f'{type(e).__name__}: {e}')
  else:
    print(f'no error from {fn.__name__}')


class _ReadsSelfW(GatedFeedForward):

  def FProp(self, theta, inputs):
    theta = NestedMap(theta)
    theta.w_in = self.w_in  # The slip: a variable read outside theta.
    return super().FProp(theta, inputs)


def SelfW():
  slip = [_ReadsSelfW.Params().Set(name='ffn0', input_dim=32, hidden_dim=64)]
  TrainStep(pipe.params.Copy().Set(layers=slip + layers[1:]).Instantiate())


def BatchNormNotForwarded():
  del NormedFeedForward.FPropWithUpdates
  with tf.GradientTape():
    fresh = bn_pipe.params.Copy().Instantiate()
    fresh.FProp(fresh.theta, bn_x)


def NoFPropMeta():
  del GatedFeedForward.FPropMeta
  pipe.params.Copy().Instantiate()


for mistake in (SelfW, BatchNormNotForwarded, NoFPropMeta):
  _Say(mistake)
'''


def _Words(text: str) -> str:
  return ' '.join(text.split())


@pytest.fixture(scope='module')
def run() -> subprocess.CompletedProcess:
  program = '\n\n'.join(doc_blocks.Code(DOC.read_text(), 'python'))
  return fresh_process.RunPython('-c', program + _MISTAKES, timeout_s=900)


def test_the_example_pipelines_the_layers_and_equals_them_unpipelined(run):
  lines = run.stdout.splitlines()
  assert 'cells: [[0, 1], [2, 3]]' in lines, run.stdout
  assert any(line.startswith('pipeline == layers: loss ') and
             line.endswith(', 16 gradients') for line in lines), run.stdout


def test_the_messages_it_quotes_are_the_librarys(run):
  quotes = doc_blocks.Code(DOC.read_text(), 'text')
  assert len(quotes) == 3
  said = _Words(run.stdout)
  for quote in quotes:
    assert _Words(quote) in said, f'{quote}\nnot in the output:\n{run.stdout}'
