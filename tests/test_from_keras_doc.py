"""docs/from_keras.md cannot rot: its Python blocks run, in order, as one
program in a fresh process (its logical devices must be set before
TensorFlow starts), and the lines it quotes in text blocks are printed."""

import re
import subprocess

import pytest

from tests import doc_blocks
from tests import fresh_process

DOC = fresh_process.ROOT / 'docs' / 'from_keras.md'


@pytest.fixture(scope='module')
def run() -> subprocess.CompletedProcess:
  program = '\n\n'.join(doc_blocks.Code(DOC.read_text(), 'python'))
  return fresh_process.RunPython('-c', program, timeout_s=900)


def test_the_pipelined_keras_models_equal_keras_and_train(run):
  lines = run.stdout.splitlines()
  assert 'pipelined == Keras: eval outputs' in lines, run.stdout
  (loss_line,) = [line for line in lines if line.startswith('loss: first 10 steps')]
  first, last = (float(v) for v in re.findall(r'\d+\.\d+', loss_line))
  assert last < 0.75 * first, loss_line  # it learns (ln 2 = 0.69 at chance)
  (accuracy_line,) = [line for line in lines if line.startswith('Keras accuracy')]
  assert float(accuracy_line.split()[-1]) >= 0.85, accuracy_line


def test_keras_fit_trains_the_pipeline_and_saves_a_keras_model(run):
  (fit_line,) = [line for line in run.stdout.splitlines() if line.startswith('Keras fit:')]
  val_accuracy, saved_accuracy = (float(v) for v in re.findall(r'\d+\.\d+', fit_line))
  assert val_accuracy >= 0.85 and saved_accuracy == val_accuracy, fit_line


def test_the_lines_it_quotes_are_printed(run):
  quotes = doc_blocks.Code(DOC.read_text(), 'text')
  assert len(quotes) == 3
  for quote in quotes:
    assert quote.strip() in run.stdout.splitlines(), f'{quote}\nnot in:\n{run.stdout}'
