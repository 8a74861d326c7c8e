"""The SavedModel of a task whose serving signature fixes the batch takes
any batch up to that maximum and refuses more with an error naming it
(issue 28, point 9), loaded by a process that does not import the project."""

import sys

from tests.trainer import your_experiment

KEY = your_experiment.KEY
_LOAD = '''
import sys
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']
for rows in (3, 32):
  print(rows, serve(features=tf.zeros([rows, 16]))['predictions'].shape)
try:
  serve(features=tf.zeros([40, 16]))
except tf.errors.InvalidArgumentError as e:
  print('refused:', ' '.join(e.message.split()))
'''


def test_export_takes_any_batch_up_to_the_maximum(tmp_path):
  your_experiment.WriteModule(tmp_path)
  common = [f'--model={KEY}', '--logdir=run']
  your_experiment.RunTrainerInProcess(tmp_path, *common, '--mode=train',
                                      '--model_params_override=trainer.max_steps=50')
  exported = your_experiment.RunTrainerInProcess(tmp_path, *common, '--mode=export').stdout
  assert '(serving_default takes 1 to 32 rows a call)' in exported, exported
  (tmp_path / 'load.py').write_text(_LOAD)
  out = your_experiment.RunCommand(tmp_path, [sys.executable, 'load.py', 'run/export/50'],
                                   env={'TF_CPP_MIN_LOG_LEVEL': '3'}).stdout
  assert '3 (3,)\n' in out and '32 (32,)\n' in out, out
  assert ("serving_default takes at most 32 rows per call (the batch the "
          "pipeline was built for); input features has more: split the batch.") in out, out
