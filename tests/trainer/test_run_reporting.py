"""What a run tells its user (issue 28, points 7 and 8; issue 46): one
opening line before any tracing, a line while the step is built, the
task's metrics on the progress line (an ETA from the second loop on) and
in TensorBoard, eval counts summed, a closing line saying where the results
are, params.txt written only by training, and a finished run that says
nothing was trained."""

import pathlib

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind
from tests.pipeline import pipeline_models as models
from tests.trainer import summaries
from tests.trainer import your_experiment
from trainer import run_summary

KEY = your_experiment.KEY


def _Train(cwd: pathlib.Path, logdir: str, *flags: str):
  """The trainer in this process: what it prints is the trainer's, the
  console script adds nothing (test_your_experiment runs that)."""
  return your_experiment.RunTrainerInProcess(cwd, f'--model={KEY}', f'--logdir={logdir}',
                                             *flags)


def test_opening_line_metrics_and_eval_sums(tmp_path):
  your_experiment.WriteModule(tmp_path)
  out = _Train(tmp_path, 'run', '--mode=train_and_eval',
               '--model_params_override=trainer.max_steps=100').stdout.splitlines()
  assert out[0] == (f'{KEY} (train_and_eval): pipe: K=2 cells, M=4 micro-batches, '
                    'schedule GPIPE, devices CPU:0 CPU:1; logdir run'), out[0]
  # Before the wait for the first loop, a line says what is being built.
  assert out[1].startswith('Building the training step'), out[1]
  assert 'a progress line every trainer.steps_per_loop=50 steps' in out[1]
  progress = [line for line in out if line.startswith('step ')]
  assert len(progress) == 2 and all('  accuracy 0.' in line for line in progress)
  # The first loop's time includes building the step: no ETA from it.
  assert progress[0].endswith('ETA from the next loop (this one built the step)'), progress
  assert progress[1].endswith('ETA 0m00s'), progress
  assert 'num_examples' not in progress[0]
  train = summaries.Scalars(str(tmp_path / 'run'), 'train')
  assert [s for s, _ in train['accuracy']] == [50, 100]
  assert all(0 <= v <= 1 for _, v in train['accuracy'])
  # eval_steps=4 batches of 32 examples: counted, not averaged.
  assert 'num_examples 128' in out[-2], out[-2]
  # The last line says where everything is.
  assert out[-1] == ('Done at step 100: checkpoints in run/checkpoints; curves: '
                     f'tensorboard --logdir=run; decode: lingvo_pipe_trainer --model={KEY} '
                     '--logdir=run --mode=decode.'), out[-1]
  assert summaries.Scalars(str(tmp_path / 'run'), 'eval')['num_examples'] == [(100, 128.0)]


def test_params_text_records_what_trained_and_finished_runs_say_so(tmp_path):
  your_experiment.WriteModule(tmp_path)
  logdir = tmp_path / 'run'
  _Train(tmp_path, 'run', '--mode=train', '--model_params_override='
         'trainer.max_steps=50; trainer.learning_rate=0.02')
  trained = (logdir / 'params.txt').read_text()
  assert 'trainer.learning_rate : 0.02\n' in trained

  evaluated = _Train(tmp_path, 'run', '--mode=eval',
                     '--model_params_override=trainer.learning_rate=0.5')
  assert 'eval at step 50' in evaluated.stdout
  again = _Train(tmp_path, 'run', '--mode=train', '--model_params_override='
                 'trainer.max_steps=50; trainer.learning_rate=0.5')
  assert 'Nothing to train: the checkpoint is at step 50' in again.stdout
  assert not [line for line in again.stdout.splitlines() if line.startswith('step ')]
  assert (logdir / 'params.txt').read_text() == trained


@pytest.mark.parametrize('pipeline,what', [
    (dict(schedule=ScheduleKind.ZB_H1), 'schedule ZB_H1, devices CPU:0 CPU:1'),
    (dict(schedule_text='0F0,0F1,0B0,0B1;1F0,1B0,1F1,1B1'),
     'schedule text, devices CPU:0 CPU:1'),
    (dict(num_replicas=2), 'R=2 replicas, schedule GPIPE, devices CPU:0 CPU:1 | CPU:2 CPU:3'),
])
def test_the_opening_line_names_the_schedule_and_devices_that_run(pipeline, what):
  task = tf.Module()
  task.pipe = models.Pipeline(*models.FfnLayers(), 2, 2, **pipeline)
  assert run_summary.PipelineLines(task) == [f'pipe: K=2 cells, M=2 micro-batches, {what}']
