"""What a Keras layer may not bring into a pipeline, refused in one line.

A KerasLayer refuses, as it is built, Keras layers with state or side
channels the project cannot honour (each message names the layer and the
fix): random layers (a Keras SeedGenerator), a trainable
BatchNormalization, stateful RNNs, masks, regularizers, mixed-precision
policies, and variables that are not float32 weights.
"""

from typing import Any

import tensorflow as tf

# Keras 3, the one TensorFlow exports.
keras = tf.keras


class KerasLayerError(ValueError):
  """A Keras layer that a KerasLayer cannot run with the project's guarantees."""


def What(name: str, layer: Any) -> str:
  """How a refusal names Keras layer `layer` of KerasLayer `name`."""
  return f'KerasLayer {name!r}: Keras layer {layer.name!r} ({type(layer).__name__})'


def CheckSupported(sub: Any, name: str) -> None:
  """Raises KerasLayerError if (sub)layer `sub` has state or side channels
  that a pipeline cannot honour, with the fix."""
  what = What(name, sub)
  CheckFloat32(sub, what)
  if isinstance(sub, keras.layers.BatchNormalization) and sub.trainable:
    raise KerasLayerError(
        f'{what} updates its moving statistics in call, which a pipeline (one call '
        'per micro-batch, again when it recomputes) cannot honour; put it in the chain '
        'itself (KerasLayers maps it to normalization.BatchNormLayer, whose statistics '
        'the pipeline updates once per step), or freeze it (trainable=False).')
  if getattr(sub, 'stateful', False) is True:
    raise KerasLayerError(
        f'{what} is stateful: it carries states between batches in variables, which '
        "micro-batches and recomputation would corrupt; build it with stateful=False.")
  if any(isinstance(v, keras.random.SeedGenerator) for v in vars(sub).values()):
    raise KerasLayerError(
        f'{what} draws random numbers from a Keras SeedGenerator, whose numbers would '
        'change with the micro-batches and differ when a cell recomputes; use '
        "lingvo_pipe's dropout.DropoutLayer instead (KerasLayers turns a Keras "
        'Dropout among the layers it is given into one), or set its rate to 0.')
  if getattr(sub, 'mask_zero', False) is True or isinstance(sub, keras.layers.Masking):
    raise KerasLayerError(
        f'{what} makes a mask that Keras hands to later layers on the side, which '
        "a pipeline's cells do not carry; pass paddings as an input instead.")
  CheckNoRegularizers(sub, what)


def CheckFloat32(layer: Any, what: str) -> None:
  """Raises KerasLayerError (naming `what`) unless the Keras `layer` runs
  in float32."""
  policy = layer.dtype_policy.name
  if policy != 'float32':
    raise KerasLayerError(
        f'{what} has the dtype policy {policy!r}; Keras layers run in float32 only '
        "for now: build them under keras.mixed_precision.set_global_policy('float32') "
        "(or dtype='float32').")


def CheckNoRegularizers(layer: Any, what: str) -> None:
  """Raises KerasLayerError (naming `what`) if the Keras `layer` has
  regularizers, whose losses the pipeline would drop."""
  regularizers = sorted(k for k, v in vars(layer).items()
                        if k.endswith('regularizer') and v is not None)
  if regularizers:
    raise KerasLayerError(
        f'{what} has regularizers {regularizers}, whose losses (Keras\'s '
        'model.losses) the pipeline would drop; remove them and add the term to '
        'your loss (or use the trainer\'s regularization).')


def CheckWeights(layer: Any, name: str) -> None:
  """Raises KerasLayerError for variables that are not float32 weights."""
  weight_ids = {id(w) for w in layer.weights}
  state = [v.path for v in layer.variables if id(v) not in weight_ids]
  if state:
    raise KerasLayerError(f'{What(name, layer)} holds state that is no weight '
                          f'(seed generators, metrics): {state}; remove it.')
  other = [(w.path, tf.as_dtype(w.dtype).name) for w in layer.weights
           if tf.as_dtype(w.dtype) != tf.float32]
  if other:
    raise KerasLayerError(f'{What(name, layer)} has weights that are not float32: '
                          f'{other}; only float32 weights are supported for now.')
