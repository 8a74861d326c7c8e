"""A Keras model as a PipeliningLayer's layers, and its weights both ways.

`KerasLayers` turns a Keras model that is a chain (a Sequential, a
functional model of one path, a list of layers, or the class of such a
model, which params text and so experiments hold) into the layers of a
PipeliningLayer: a KerasLayer each; among them a Keras Dropout becomes the
project's DropoutLayer and a Keras BatchNormalization its BatchNormLayer
(whose moving statistics the pipeline updates once per step, from the
whole batch). `CopyWeightsFromKeras` and `CopyWeightsToKeras`
move the weights between the Keras model and those layers, so a user goes
Keras -> pipelined training -> Keras without conversion scripts.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers.keras_layer import BuiltKerasLayer
from lingvo_pipe.core.layers.keras_layer import KerasLayer
from lingvo_pipe.core.layers.keras_layer import NewModel
from lingvo_pipe.core.layers.keras_layer import SharedModel
from lingvo_pipe.core.layers.keras_refusals import CheckFloat32
from lingvo_pipe.core.layers.keras_refusals import CheckNoRegularizers
from lingvo_pipe.core.layers.keras_refusals import KerasLayerError

keras = tf.keras

KerasModelOrLayers = Union[Any, Sequence[Any]]


def KerasLayers(model_or_layers: KerasModelOrLayers,
                input_shape: Sequence[Optional[int]]) -> List[hyperparams.Params]:
  """The params of the layers of a PipeliningLayer that computes a Keras chain.

  Each Keras layer becomes a KerasLayer named by the Keras layer's name
  (name them: Keras numbers unnamed layers by how many the process made,
  and the names are in the variables' paths), whose factory returns that
  very layer (so CopyWeightsToKeras writes into the model given); a Keras
  Dropout becomes a dropout.DropoutLayer
  (keep_prob = 1 - rate), whose masks are the project's per-example
  stateless ones, not Keras's; a trainable Keras BatchNormalization
  becomes a normalization.BatchNormLayer (decay = momentum, same epsilon):
  each micro-batch is normalized with its own statistics, as GPipe does,
  and the moving averages follow the whole batch's, once per step (a
  frozen one, trainable=False, stays a KerasLayer: it only reads them).

  Args:
    model_or_layers: a keras.Sequential, a functional keras.Model whose
      layers form a chain (one input, each layer feeding the next, one
      output), a list of Keras layers applied in order, or the class of
      such a model (built by its constructor, taking no arguments): then the
      layers are its SharedModel's and each KerasLayer's params name the
      class and the layer (model_layer), which params text holds, so an
      experiment can.
    input_shape: the shape of the chain's input, batch included (None
      allowed), e.g. [None, 16]; unbuilt layers are built with it.

  Returns:
    Params for PipeliningLayer.Params().Set(layers=...).

  Raises:
    TypeError: for anything but a Sequential, a functional model, a list
      of Keras layers or a Keras model class.
    KerasLayerError: if the model is not a chain, or for a layer a
      KerasLayer refuses.
  """
  if isinstance(model_or_layers, type):
    # An instance of its own, in a graph of its own: experiments make their
    # params before the trainer sets up the devices, which a variable made
    # eagerly would fix at one.
    with tf.Graph().as_default():
      return _LayerParams(_Chain(NewModel(model_or_layers)), input_shape,
                          model_class=model_or_layers)
  return _LayerParams(_Chain(model_or_layers), input_shape, model_class=None)


def _LayerParams(chain: List[Any], input_shape: Sequence[Optional[int]],
                 model_class: Optional[type]) -> List[hyperparams.Params]:
  """KerasLayers of the layers of a chain; with model_class, KerasLayers
  that name the class and their layer instead of holding the layer."""
  shapes = [tf.TensorShape(input_shape)]
  out = []
  for layer in chain:
    name = _LayerName(layer)
    if isinstance(layer, keras.layers.Dropout):
      if len(shapes) != 1:
        raise KerasLayerError(f'Keras Dropout {layer.name!r} follows a layer of '
                              f'{len(shapes)} outputs; it takes one.')
      out.append(_DropoutParams(layer, name, shapes[0]))
      continue
    if _UpdatesStatistics(layer):
      out.append(_BatchNormParams(layer, name, shapes))
      continue
    p = KerasLayer.Params().Set(name=name, input_shapes=[s.as_list() for s in shapes])
    if model_class is None:
      p.Set(factory=_Returning(layer))
    else:
      p.Set(factory=model_class, model_layer=layer.name)
    BuiltKerasLayer(p, layer)  # refuses what it must, naming the layer, then builds
    spec = layer.compute_output_spec(*[keras.KerasTensor(tuple(s.as_list()))
                                       for s in shapes])
    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    shapes = [tf.TensorShape(s.shape) for s in specs]
    out.append(p)
  return out


def _Chain(model_or_layers: KerasModelOrLayers) -> List[Any]:
  """The Keras layers of a Sequential, a chain-shaped functional model or a
  list, in the order they apply."""
  if isinstance(model_or_layers, type):
    return _Chain(SharedModel(model_or_layers))
  if isinstance(model_or_layers, (list, tuple)):
    layers = list(model_or_layers)
    bad = [type(l).__name__ for l in layers if not isinstance(l, keras.layers.Layer)]
    if bad or not layers:
      raise TypeError(f'KerasLayers takes a non-empty list of Keras layers; got {bad or []}.')
    return layers
  if isinstance(model_or_layers, keras.Sequential):
    return list(model_or_layers.layers)  # each built below, after its checks
  if isinstance(model_or_layers, keras.Model):
    return _FunctionalChain(model_or_layers)
  raise TypeError(f'KerasLayers takes a keras.Sequential, a functional keras.Model '
                  f'or a list of Keras layers, not {type(model_or_layers).__name__}.')


def _FunctionalChain(model: Any) -> List[Any]:
  """The layers of a functional model, if each feeds the next and only it."""
  inputs, outputs = getattr(model, 'inputs', None), getattr(model, 'outputs', None)
  if not inputs or not outputs:
    raise TypeError(f'Keras model {model.name!r} ({type(model).__name__}) is not '
                    'functional: its call order is not known. Pass its layers as a '
                    'list in call order, or a KerasLayer of the whole model.')
  if len(inputs) != 1 or len(outputs) != 1:
    raise KerasLayerError(f'Keras model {model.name!r} has {len(inputs)} inputs and '
                          f'{len(outputs)} outputs; KerasLayers takes a chain of one '
                          'input and one output.')
  layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
  expected = inputs[0]
  for layer in layers:
    try:
      fed = layer.input
    except (AttributeError, ValueError):  # several inbound nodes: a shared layer
      fed = None
    if fed is not expected:
      raise KerasLayerError(
          f'Keras model {model.name!r} is not a chain: layer {layer.name!r} does not '
          'take exactly the output of the layer before it. Pipeline a chain: wrap '
          'each branching part (e.g. a residual block) in a Keras layer of its own.')
    expected = layer.output
  if expected is not outputs[0]:
    raise KerasLayerError(f'Keras model {model.name!r} is not a chain: its output is not '
                          'its last layer\'s.')
  return layers


def _LayerName(layer: Any) -> str:
  name = ''.join(c if c.isalnum() or c == '_' else '_' for c in layer.name)
  return name if name.isidentifier() else f'keras_{name}'


def _DropoutParams(layer: Any, name: str, shape: tf.TensorShape) -> hyperparams.Params:
  """A Keras Dropout of inputs of `shape` as DropoutLayer params: the dims
  where its noise_shape is 1 (and the input's is not) broadcast."""
  noise = layer.noise_shape
  dims = shape.as_list() if shape.rank is not None else []
  if noise is not None and (len(noise) != len(dims) or any(
      n not in (None, 1, d) for n, d in zip(noise, dims))):
    raise KerasLayerError(f'Keras Dropout {layer.name!r}: noise_shape {noise} for inputs '
                          f'{shape} may hold only None, 1 (a broadcast dim) or the '
                          "input's dim to map to a DropoutLayer.")
  dims = [i for i, (n, d) in enumerate(zip(noise or (), dims)) if n == 1 and d != 1] or None
  return dropout.DropoutLayer.Params().Set(name=name, keep_prob=1.0 - float(layer.rate),
                                           noise_shape_broadcast_dims=dims)


def _UpdatesStatistics(layer: Any) -> bool:
  return isinstance(layer, keras.layers.BatchNormalization) and layer.trainable


def _BatchNormParams(layer: Any, name: str,
                     shapes: List[tf.TensorShape]) -> hyperparams.Params:
  """A trainable Keras BatchNormalization as BatchNormLayer params; built
  (its weights are copied both ways) if it was not."""
  what = f'Keras BatchNormalization {layer.name!r}'
  CheckFloat32(layer, what)
  CheckNoRegularizers(layer, what)
  unsupported = [k for k in ('renorm', 'synchronized') if getattr(layer, k, False)]
  unsupported += [k for k in ('center', 'scale') if not getattr(layer, k)]
  if unsupported:
    raise KerasLayerError(f'{what} sets {unsupported}; BatchNormLayer has a trainable '
                          'gamma and beta and neither renormalization nor cross-replica '
                          'statistics: build it with the defaults.')
  if layer.axis not in (-1, shapes[0].rank - 1):
    raise KerasLayerError(f'{what} normalizes axis {layer.axis}; BatchNormLayer '
                          'normalizes the last axis: move the channels last.')
  if len(shapes) != 1 or shapes[0].rank not in (2, 4):
    raise KerasLayerError(f'{what} takes inputs of shapes {[str(s) for s in shapes]}; '
                          'it maps to normalization.BatchNormLayer, which takes one '
                          'input of rank 2 or 4 (channels last).')
  shape = shapes[0]
  if not layer.built:
    layer(keras.KerasTensor(tuple(shape.as_list())))
  return normalization.BatchNormLayer.Params().Set(
      name=name, dim=int(shape[-1]), decay=float(layer.momentum),
      epsilon=float(layer.epsilon))


def _Returning(layer: Any) -> Callable[[], Any]:
  """A factory returning `layer` itself (a function: Params copy it as is)."""

  def Factory() -> Any:
    return layer

  return Factory


def _Mapped(layer: base_layer.BaseLayer) -> bool:
  """Whether `layer` is one KerasLayers makes from a Keras layer with weights."""
  return isinstance(layer, (KerasLayer, normalization.BatchNormLayer))


def _OrderedVariables(layer: base_layer.BaseLayer) -> List[tf.Variable]:
  """The variables of a mapped layer in the order of its Keras layer's weights."""
  if isinstance(layer, KerasLayer):
    return layer.KerasOrderedVariables()
  return [layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance]


def _Pairs(layer: base_layer.BaseLayer,
           model_or_layers: KerasModelOrLayers) -> List[Tuple[List[tf.Variable], Any]]:
  """(variables of a layer in `layer`, Keras layer) pairs, in order, checked
  to hold weights of the same shapes."""
  keras_layers = [l for l in _Chain(model_or_layers)
                  if not isinstance(l, keras.layers.Dropout)]
  ours = [l for l in layer.Walk() if _Mapped(l)]
  if len(ours) != len(keras_layers):
    raise ValueError(f'{layer.path!r} holds {len(ours)} KerasLayers and batch norms, '
                     f'the Keras model {len(keras_layers)} layers (Dropout aside); pass '
                     'the model its layers came from (KerasLayers).')
  pairs = []
  for mine, theirs in zip(ours, keras_layers):
    variables = _OrderedVariables(mine)
    want = [tuple(w.shape) for w in theirs.weights]
    have = [tuple(v.shape) for v in variables]
    if want != have:
      raise ValueError(f'{type(mine).__name__} {mine.path!r} has weights of shapes '
                       f'{have}, Keras layer {theirs.name!r} {want}; the layers do not '
                       'match.')
    pairs.append((variables, theirs))
  return pairs


def WeightPairs(layer: base_layer.BaseLayer,
                model_or_layers: KerasModelOrLayers) -> List[Tuple[tf.Variable, Any]]:
  """(variable of `layer`, the Keras weight it stands for), in the order of
  the Keras layers and of each one's `weights`: e.g. to compare gradients
  with the Keras model's, or to give weights optimizer settings of their own.

  Raises:
    ValueError: if the layers or their weights' shapes do not match.
  """
  return [(var, w) for variables, theirs in _Pairs(layer, model_or_layers)
          for var, w in zip(variables, theirs.weights)]


def CopyWeightsFromKeras(layer: base_layer.BaseLayer,
                         model_or_layers: KerasModelOrLayers) -> None:
  """Assigns the weights of a built Keras model (or list of layers) to the
  KerasLayers of `layer` (e.g. a PipeliningLayer made by KerasLayers), the
  i-th KerasLayer (or BatchNormLayer) met by layer.Walk() from the i-th
  Keras layer (Dropout aside). With num_replicas > 1 the trainer sets the replicas' copies
  from these before training; a loop of one's own calls
  replica_variables.SetCopiesToOriginals.

  Raises:
    ValueError: if the layers or their weights' shapes do not match.
  """
  for var, w in WeightPairs(layer, model_or_layers):
    var.assign(tf.convert_to_tensor(w))


def CopyWeightsToKeras(layer: base_layer.BaseLayer,
                       model_or_layers: KerasModelOrLayers) -> None:
  """Writes the variables of the KerasLayers of `layer` into the Keras
  model (or list of layers) with `set_weights`: the inverse of
  CopyWeightsFromKeras, e.g. after training, to save or serve with Keras.

  Raises:
    ValueError: if the layers or their weights' shapes do not match.
  """
  for variables, theirs in _Pairs(layer, model_or_layers):
    theirs.set_weights([v.numpy() for v in variables])
