"""PipelinedKerasModel: Keras's own fit, evaluate and predict on a pipelined
Keras chain equal the same calls on the Keras model (losses and metrics of
every epoch, trained weights, evaluation, predictions), across schedules and
replicas; Keras's callbacks work on it; and what it cannot run is refused
before any step, naming the fix."""

import glob
import re

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline.keras_model import PipelinedKerasModel
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

keras = tf.keras
BATCH, DIM, CLASSES = 16, 8, 3


def _Chain() -> keras.Sequential:
  return keras.Sequential([
      keras.Input((DIM,)),
      keras.layers.Dense(16, activation='relu', name='dense'),
      keras.layers.LayerNormalization(name='norm'),
      keras.layers.Dense(16, activation='tanh', name='dense_1'),
      keras.layers.Dense(CLASSES, name='logits')])


def _Pair(**pipeline):
  """The Keras model and its pipelined twin, same weights, both compiled
  with Adam and cross entropy."""
  keras.utils.set_random_seed(1)
  theirs, ours = _Chain(), _Chain()
  ours.set_weights(theirs.get_weights())
  piped = PipelinedKerasModel(ours, [BATCH, DIM], **pipeline)
  for model in (theirs, piped):
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=['accuracy'],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return theirs, piped


def _Data(n: int = 4 * BATCH):
  x = np.random.RandomState(0).normal(size=(n, DIM)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
  return x, y


def _Close(actual, expected, what):
  np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=what)


@pytest.mark.parametrize('pipeline', [
    dict(num_partitions=2, num_micro_batches=4, schedule=ScheduleKind.ONE_F_ONE_B),
    dict(num_partitions=2, num_micro_batches=2, num_replicas=2, schedule=ScheduleKind.ZB_H1),
    dict(num_partitions=2, micro_batch_size=4, schedule=ScheduleKind.ONE_F_ONE_B),
    pytest.param(dict(num_partitions=4, num_micro_batches=4, schedule=ScheduleKind.GPIPE,
                      loop_min_micro_batches=2), marks=pytest.mark.slow),
    pytest.param(dict(num_partitions=1, num_micro_batches=1), marks=pytest.mark.slow),
], ids=['K2-M4-1F1B', 'K2-M2-R2-ZB_H1', 'K2-micro_batch_size4-1F1B', 'K4-M4-GPIPE-loop', 'K1-M1'])
def test_fit_evaluate_and_predict_equal_the_keras_models(pipeline):
  theirs, piped = _Pair(**pipeline)
  x, y = _Data()
  expected = theirs.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
  history = piped.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
  assert set(history.history) == {'loss', 'accuracy'}
  for key, values in expected.history.items():
    _Close(history.history[key], values, key)
  for w, (ours, want) in enumerate(zip(piped.get_weights(), theirs.get_weights())):
    _Close(ours, want, f'weight {w}')
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
  _Close(piped.evaluate(dataset, verbose=0), theirs.evaluate(dataset, verbose=0), 'evaluate')
  _Close(piped.predict(x, batch_size=BATCH, verbose=0),
         theirs.predict(x, batch_size=BATCH, verbose=0), 'predict')


def test_keras_callbacks_checkpoint_stop_early_and_log(tmp_path):
  """ModelCheckpoint saves a Keras model with the trained weights (it
  loads without this project); EarlyStopping restores the best epoch's
  weights (get_weights/set_weights); TensorBoard writes its logs."""
  _, piped = _Pair(num_partitions=2, num_micro_batches=2)
  x, y = _Data()
  saved = str(tmp_path / 'epoch{epoch}.keras')
  best = {}

  class RecordWeights(keras.callbacks.Callback):

    def on_epoch_end(self, epoch, logs=None):
      best.setdefault('loss', []).append(logs['loss'])
      best.setdefault('weights', []).append(self.model.get_weights())

  stop = keras.callbacks.EarlyStopping(monitor='loss', patience=1, min_delta=10.0,
                                       restore_best_weights=True)
  piped.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0,
            callbacks=[RecordWeights(), keras.callbacks.ModelCheckpoint(saved), stop,
                       keras.callbacks.TensorBoard(str(tmp_path / 'tb'))])
  # min_delta=10 counts no epoch as better than the first: stopped after two,
  # the first epoch's weights restored.
  assert len(best['loss']) == 2
  for ours, want in zip(piped.get_weights(), best['weights'][0]):
    _Close(ours, want, 'restored weights')
  loaded = keras.models.load_model(str(tmp_path / 'epoch2.keras'))
  for ours, want in zip(loaded.get_weights(), best['weights'][1]):
    _Close(ours, want, 'saved weights')
  assert glob.glob(str(tmp_path / 'tb' / 'train' / 'events.out.tfevents.*'))


def test_optimizer_slots_are_on_their_variables_devices():
  """Adam's moments of each variable are on its cell's device (Keras would
  put them all on the default device)."""
  _, piped = _Pair(num_partitions=2, num_micro_batches=2)
  # Keras names a slot by its variable's name, '/' and ':' made '_'.
  devices = {re.sub('[/:]', '_', v.name): v.device for v in piped.trainable_weights}
  assert len(set(devices.values())) == 2
  slots = [v for v in piped.optimizer.variables if v.name.endswith(('_momentum', '_velocity'))]
  assert len(slots) == 2 * len(devices)
  for slot in slots:
    assert slot.value.device == devices[slot.name.rsplit('_', 1)[0]], slot.name


def test_refuses_what_it_cannot_run_before_any_step():
  _, piped = _Pair(num_partitions=2, num_micro_batches=2)
  x, y = _Data(3 * BATCH + 4)
  before = piped.get_weights()
  with pytest.raises(ValueError, match=rf'batches of {BATCH} examples; {3 * BATCH + 4} '
                     r'examples leave a last batch of 4: drop the remainder'):
    piped.fit(x, y, shuffle=False, verbose=0)
  with pytest.raises(ValueError, match=rf'not batch_size=8; pass batch_size={BATCH}'):
    piped.predict(x[:BATCH], batch_size=8, verbose=0)
  ragged = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  with pytest.raises(ValueError, match=rf"dataset's batches hold None: batch it with "
                     rf'.batch\({BATCH}, drop_remainder=True\)'):
    piped.evaluate(ragged, verbose=0)
  with pytest.raises(ValueError, match='no sample weights'):
    piped.fit(x[:BATCH], y[:BATCH], sample_weight=np.ones(BATCH), verbose=0)
  for ours, want in zip(piped.get_weights(), before):
    np.testing.assert_array_equal(ours, want)
  with pytest.raises(ValueError, match=r'jit_compile=True .*cell_compilation'):
    piped.compile(optimizer='sgd', loss='mse', jit_compile=True)
  with pytest.raises(ValueError, match=r"reduction 'sum'.*sum_over_batch_size"):
    piped.compile(optimizer='sgd', loss=keras.losses.MeanSquaredError(reduction='sum'))
