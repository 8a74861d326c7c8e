"""PipelinedKerasModel: Keras's compile, fit, evaluate and predict on a
pipelined Keras chain.

A keras.Model whose training step is the pipeline's: `fit` runs
PipeliningLayer.FPropWithLoss under a GradientTape, the compiled loss
taken per micro-batch inside the pipeline (in the schedule's order) and
the compiled optimizer applied to the pipeline's variables, on their
devices; `evaluate` and `predict` run the pipeline in evaluation mode.
Keras's callbacks see a Keras model: get_weights/set_weights (EarlyStopping
restoring the best weights) read and write the pipeline's variables in the
Keras model's order, and save/save_weights (ModelCheckpoint) write the
trained weights into the Keras model first and save it, so what is saved
loads without this project.
"""

from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import step_seeds
from lingvo_pipe.core.layers import keras_models
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.replicas import replica_variables

keras = tf.keras

# Keras loss reductions whose value is the mean over the batch, which a sum
# of micro-batch means weighted by their share of the batch equals.
_MEAN_REDUCTIONS = ('sum_over_batch_size', 'mean')
_NO_SAMPLE_WEIGHTS = ('PipelinedKerasModel.fit takes no sample weights yet; weigh the '
                      'examples in the loss function.')


class PipelinedKerasModel(tf.keras.Model):
  """A Keras chain (a Sequential, a functional chain, a list of layers)
  pipelined, trained by Keras.

  Args:
    model: the Keras chain; the pipeline starts from its weights, and
      save/save_weights write the trained ones back into it.
    batch_shape: the input's shape with the batch every step runs, e.g.
      [32, 28, 28, 1]: fit, evaluate and predict take batches of exactly
      that many examples (a tf.data.Dataset batched with
      drop_remainder=True, or arrays whose length it divides).
    **pipeline: PipeliningLayer params, e.g. num_partitions=2,
      num_micro_batches=4, schedule=ScheduleKind.ONE_F_ONE_B.
  """

  def __init__(self, model: Any, batch_shape: Sequence[int], name: str = 'pipelined',
               **pipeline: Any) -> None:
    super().__init__(name=name)
    pipe = gpipe.PipeliningLayer.Params().Set(
        name='pipe', layers=keras_models.KerasLayers(model, [None, *batch_shape[1:]]),
        input_shapes=[list(batch_shape)], **pipeline).Instantiate()
    # Kept out of Keras's tracking: the pipeline's variables are tf.Variables
    # on the cells' devices, the Keras model's are not trained.
    self.__dict__['pipeline'] = pipe
    self.__dict__['keras_model'] = model
    self.__dict__['batch_size'] = int(batch_shape[0])
    keras_models.CopyWeightsFromKeras(pipe, model)
    replica_variables.SetCopiesToOriginals(pipe)
    self.built = True

  @property
  def trainable_weights(self) -> List[tf.Variable]:
    """What the optimizer trains: the pipeline's variables and their
    replica copies."""
    return replica_variables.TrainedVariables(self.pipeline)

  @property
  def losses(self) -> List[tf.Tensor]:
    """None: KerasLayers refuses layers that add losses or regularizers."""
    return []

  def compile(self, optimizer: Any = 'rmsprop', loss: Any = None, jit_compile: Any = False,
              **kwargs: Any) -> None:
    """keras.Model.compile; the step is not compiled by XLA as a whole
    (the cells run on their own devices), and the optimizer's slots are
    made on their variables' devices.

    Raises:
      ValueError: for jit_compile=True, or a loss that is not a mean over
        the batch.
    """
    if jit_compile is True:
      raise ValueError('PipelinedKerasModel: jit_compile=True would compile the whole '
                       'pipelined step into one XLA cluster, undoing the placement of '
                       "its cells; leave it unset (set the pipeline's "
                       'cell_compilation to compile each cell instead).')
    for one in [l for l in tf.nest.flatten(loss) if l is not None]:
      reduction = getattr(keras.losses.get(one) if isinstance(one, str) else one,
                          'reduction', 'sum_over_batch_size')
      if reduction not in _MEAN_REDUCTIONS:
        raise ValueError(f'PipelinedKerasModel: loss {one!r} has reduction '
                         f'{reduction!r}; the pipeline sums micro-batch terms weighted '
                         'by their share of the batch, which equals a mean over the '
                         "batch: use reduction='sum_over_batch_size'.")
    super().compile(optimizer=optimizer, loss=loss, jit_compile=False, **kwargs)
    self._BuildOptimizerOnTheVariablesDevices()

  def call(self, x: Any, training: Optional[bool] = None) -> Any:
    """The pipeline's outputs (in evaluation mode unless training)."""
    if training:
      return self.pipeline.FProp(self.pipeline.theta, x)
    with eval_mode.EvalMode():
      return self.pipeline.FProp(self.pipeline.theta, x)

  def compute_output_spec(self, x: Any, training: Optional[bool] = None) -> Any:
    del training
    return self.keras_model.compute_output_spec(x)

  def fit(self, x: Any = None, y: Any = None, batch_size: Optional[int] = None,
          **kwargs: Any) -> Any:
    """keras.Model.fit, its data checked first (_CheckData)."""
    if kwargs.get('sample_weight') is not None:
      raise ValueError(_NO_SAMPLE_WEIGHTS)
    self._CheckData(x, batch_size)
    validation = kwargs.get('validation_data')
    if validation is not None:
      self._CheckData(validation if isinstance(validation, tf.data.Dataset) else validation[0],
                      kwargs.get('validation_batch_size', batch_size))
    return super().fit(x, y, batch_size=batch_size or self.batch_size, **kwargs)

  def evaluate(self, x: Any = None, y: Any = None, batch_size: Optional[int] = None,
               **kwargs: Any) -> Any:
    self._CheckData(x, batch_size)
    return super().evaluate(x, y, batch_size=batch_size or self.batch_size, **kwargs)

  def predict(self, x: Any, batch_size: Optional[int] = None, **kwargs: Any) -> Any:
    self._CheckData(x, batch_size)
    return super().predict(x, batch_size=batch_size or self.batch_size, **kwargs)

  def train_step(self, data: Any) -> Any:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
      raise ValueError(_NO_SAMPLE_WEIGHTS)
    self._CheckBatch(x)

    def MicroLoss(outputs, labels):
      # The micro-batch's mean, weighted by its share of the batch: the
      # terms sum to the batch's mean (whether M or micro_batch_size is set).
      rows = tf.cast(tf.shape(tf.nest.flatten(labels)[0])[0], tf.float32)
      return self.compute_loss(y=labels, y_pred=outputs) * rows / self.batch_size

    step = tf.cast(self.optimizer.iterations, tf.int64)
    theta = step_seeds.WithStepSeed(self.pipeline.theta, tf.stack([step, 0]))
    variables = self.trainable_weights
    with tf.GradientTape() as tape:
      loss, y_pred = self.pipeline.FPropWithLoss(theta, MicroLoss, x, loss_inputs=y)
    self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    # Keras's own 'loss' metric, which its train_step updates alike.
    self._loss_tracker.update_state(loss, sample_weight=self.batch_size)
    return self.compute_metrics(x, y, y_pred)

  def test_step(self, data: Any) -> Any:
    self._CheckBatch(keras.utils.unpack_x_y_sample_weight(data)[0])
    return super().test_step(data)

  def predict_step(self, data: Any) -> Any:
    self._CheckBatch(keras.utils.unpack_x_y_sample_weight(data)[0])
    return super().predict_step(data)

  def get_weights(self) -> List[np.ndarray]:
    """The pipeline's weights in the Keras model's order (its get_weights)."""
    return [v.numpy() for v, _ in keras_models.WeightPairs(self.pipeline, self.keras_model)]

  def set_weights(self, weights: Sequence[Any]) -> None:
    """Sets the pipeline's weights (and replica copies) from a list in the
    Keras model's order."""
    pairs = keras_models.WeightPairs(self.pipeline, self.keras_model)
    if len(weights) != len(pairs):
      raise ValueError(f'PipelinedKerasModel.set_weights: {len(weights)} arrays for '
                       f'{len(pairs)} weights.')
    for (var, _), value in zip(pairs, weights):
      var.assign(value)
    replica_variables.SetCopiesToOriginals(self.pipeline)

  def save(self, filepath: Any, *args: Any, **kwargs: Any) -> None:
    """Writes the trained weights into the Keras model and saves it."""
    keras_models.CopyWeightsToKeras(self.pipeline, self.keras_model)
    self.keras_model.save(filepath, *args, **kwargs)

  def save_weights(self, filepath: Any, *args: Any, **kwargs: Any) -> None:
    """Writes the trained weights into the Keras model and saves them."""
    keras_models.CopyWeightsToKeras(self.pipeline, self.keras_model)
    self.keras_model.save_weights(filepath, *args, **kwargs)

  def _CheckData(self, x: Any, batch_size: Optional[int]) -> None:
    """Refuses, before any step, data that would give a batch other than
    the pipeline's: a batch_size other than it, arrays whose length it does
    not divide, a tf.data.Dataset whose batches are not known to hold it."""
    if isinstance(x, tf.data.Dataset):
      batch = tf.nest.flatten(x.element_spec)[0].shape[0]
      if batch != self.batch_size:
        raise ValueError(f'PipelinedKerasModel {self.name!r} runs batches of '
                         f'{self.batch_size} examples; the dataset\'s batches hold '
                         f'{batch}: batch it with .batch({self.batch_size}, '
                         'drop_remainder=True).')
      return
    if batch_size not in (None, self.batch_size):
      raise ValueError(f'PipelinedKerasModel {self.name!r} runs batches of '
                       f'{self.batch_size} examples, not batch_size={batch_size}; pass '
                       f'batch_size={self.batch_size} or leave it unset.')
    shape = getattr(tf.nest.flatten(x)[0], 'shape', None) if x is not None else None
    if shape and shape[0] % self.batch_size:
      raise ValueError(f'PipelinedKerasModel {self.name!r} runs batches of '
                       f'{self.batch_size} examples; {shape[0]} examples leave a '
                       f'last batch of {shape[0] % self.batch_size}: drop the '
                       'remainder (x[:len(x) // batch * batch]).')

  def _CheckBatch(self, x: Any) -> None:
    batch = tf.nest.flatten(x)[0].shape[0]
    if batch != self.batch_size:
      raise ValueError(f'PipelinedKerasModel {self.name!r} runs batches of '
                       f'{self.batch_size} examples, got a batch of {batch}: give it '
                       f'batches of exactly {self.batch_size}.')

  def _BuildOptimizerOnTheVariablesDevices(self) -> None:
    """Builds the optimizer's slots, each on its variable's device (Keras
    would put them all on the default device: the first cell's would hold
    every cell's optimizer state)."""
    optimizer = self.optimizer
    make = optimizer.add_variable_from_reference

    def OnTheVariablesDevice(reference, *args, **kwargs):
      with tf.device(reference.device):
        return make(reference, *args, **kwargs)

    optimizer.add_variable_from_reference = OnTheVariablesDevice
    try:
      optimizer.build(self.trainable_weights)
    finally:
      del optimizer.add_variable_from_reference
