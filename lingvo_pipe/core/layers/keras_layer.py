"""KerasLayer: a Keras layer run as a lingvo_pipe layer whose weights are theta.

The layer tree owns the variables: a KerasLayer creates one variable per
weight of its Keras layer with CreateVariable, named by the weight's Keras
path inside that layer ('kernel', 'mha/query/kernel' as 'mha__query__kernel'),
so a checkpoint names the same weights whatever the pipeline's layout.
FProp calls the Keras layer with `stateless_call`, a pure function of the
weights it is given, with the values of theta. The Keras layer's own
variables are a template: never read by FProp, never in theta or checkpoints.

Keras layers with state the project cannot honour are refused as they are
built (keras_refusals: random layers, a trainable BatchNormalization,
which KerasLayers maps to the project's batch norm when it is in the
chain itself, stateful RNNs, masks, regularizers and mixed-precision
policies). keras_models.py turns a Keras model into a
PipeliningLayer's layers and moves weights between the two.
"""

import inspect
import math
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core import weights
from lingvo_pipe.core.layers import keras_refusals
from lingvo_pipe.core.layers.keras_refusals import KerasLayerError
from lingvo_pipe.core.nested_map import NestedMap

# Keras 3, the one TensorFlow exports; tf.keras keeps the imports to the
# packages the project depends on.
keras = tf.keras


class KerasLayer(base_layer.BaseLayer):
  """A Keras layer whose weights are this layer's variables.

  FProp(theta, *inputs) is `keras_layer.stateless_call(trainable,
  non_trainable, *inputs)` with the weights read from theta (and
  `training=not EvalMode()` if the Keras call takes `training`); its
  outputs are one tensor, or a tuple for a list or tuple of them. It
  computes in float32.
  """

  _TF_MODULE_IGNORED_PROPERTIES = frozenset(('_keras_layer',)).union(
      base_layer.BaseLayer._TF_MODULE_IGNORED_PROPERTIES)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('factory', None, 'A zero-argument callable returning the Keras '
             'layer (a callable, not the layer: Params are copied deep, a '
             'function as itself). It may return the same layer each time '
             '(KerasLayers does: every instance then calls that one layer '
             'statelessly) or a new one (name its sublayers, or their '
             'weights are named by how many layers the process made). Called '
             'by the constructor and by FPropMeta. Params text holds a Keras '
             'layer class whose arguments all have defaults, not a function.')
    p.Define('model_layer', None, 'With it, factory is a Keras model class '
             '(built by its constructor, which takes no arguments, e.g. a '
             'keras.Sequential subclass starting with keras.Input) and the '
             "Keras layer is that model's layer of this name; the model is made "
             'once per process (SharedModel) for every KerasLayer naming the '
             'class. Params text holds it, so an experiment can (KerasLayers '
             'of the class).')
    p.Define('input_shapes', None, 'Shapes of the inputs (batch dim None '
             'allowed), e.g. [[None, 16]], to build the Keras layer with if '
             'the factory returns it unbuilt.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    layer = BuiltKerasLayer(p)
    self.__dict__['_keras_layer'] = layer
    names = _WeightNames(layer, p.name)
    sublayers = _SubLayers(layer)
    for w, name in zip(layer.weights, names):
      init = _WeightInit(_Initializer(w, sublayers))
      self.CreateVariable(name, weights.WeightParams(list(w.shape), init=init),
                          trainable=w.trainable)
    by_id = {id(w): name for w, name in zip(layer.weights, names)}
    self.__dict__['_weight_names'] = names
    self.__dict__['_trainable_names'] = [by_id[id(v)] for v in layer.trainable_variables]
    self.__dict__['_non_trainable_names'] = [
        by_id[id(v)] for v in layer.non_trainable_variables]

  @property
  def keras_layer(self) -> Any:
    """The Keras layer FProp calls (its own variables are not read)."""
    return self._keras_layer

  def KerasOrderedVariables(self) -> List[tf.Variable]:
    """This layer's variables in the order of the Keras layer's `weights`."""
    return [getattr(self, n) for n in self._weight_names]

  def FProp(self, theta: NestedMap, *inputs: Any) -> Any:
    """The Keras layer's outputs for `inputs`, with the weights of theta.

    Raises:
      KerasLayerError: if the call assigned a non-trainable weight or
        added a loss, which the pipeline would lose.
    """
    layer = self.keras_layer
    trainable = [tf.convert_to_tensor(theta[n]) for n in self._trainable_names]
    fixed = [tf.convert_to_tensor(theta[n]) for n in self._non_trainable_names]
    inputs = tuple(precision.CastFloat(x, self.fprop_dtype) for x in inputs)
    kwargs = {'training': not eval_mode.IsEvalMode()} if _TakesTraining(layer) else {}
    outputs, after, losses = layer.stateless_call(
        trainable, fixed, *inputs, return_losses=True, **kwargs)
    changed = [n for n, old, new in zip(self._non_trainable_names, fixed, after)
               if new is not old]
    if changed:
      raise KerasLayerError(
          f'{keras_refusals.What(self.params.name, layer)} assigns its non-trainable weights '
          f'{changed} in call; a pipeline calls a layer once per micro-batch and '
          'again when it recomputes, so such updates cannot be honoured. Keep '
          'statistics in a lingvo_pipe layer with FPropWithUpdates (as '
          'normalization.BatchNormLayer does).')
    if losses:
      raise KerasLayerError(
          f'{keras_refusals.What(self.params.name, layer)} adds {len(losses)} loss(es) in call '
          '(add_loss), which the pipeline would drop; return the term as an '
          "output and add it to the loss (PipeliningLayer's summed_outputs).")
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else outputs

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    """Shapes from Keras's compute_output_spec; estimated costs.

    FLOPs: 2 per weight of rank >= 2 at every position of the first output
    (every element but the last dim), which is exact for Dense, EinsumDense
    projections and convolutions, plus 1 per output element for the
    elementwise work (bias, activation, norm). Products of activations with
    each other (attention's scores and context) are not counted, and a
    lookup table (Embedding) is counted as a product. param_bytes: the
    weights'. act_bytes: the outputs' only (a composite layer keeps more).

    Raises:
      ValueError: if the Keras layer does not take inputs of these shapes.
    """
    layer = BuiltKerasLayer(params)
    shapes = layer_meta.Shapes(*input_shapes)
    specs = [keras.KerasTensor(tuple(s.as_list())) for s in shapes]
    try:
      _CheckInputSpec(layer, shapes)
      spec = layer.compute_output_spec(*specs)
    except (ValueError, TypeError, tf.errors.OpError) as e:
      raise ValueError(f'{keras_refusals.What(params.name, layer)} does not take inputs of shapes '
                       f'{[str(s) for s in shapes]}: {e}') from None
    specs_out = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    out_shapes = tuple(tf.TensorShape(s.shape) for s in specs_out)
    first = out_shapes[0]
    positions = layer_meta.NumElements(first) // (first[-1] or 1) if first.rank else 1
    matrices = sum(math.prod(w.shape) for w in layer.weights if len(w.shape) >= 2)
    dtype = precision.ComputeDtype(params)
    return layer_meta.LayerMeta(
        out_shapes=out_shapes,
        flops=2 * positions * matrices + sum(layer_meta.NumElements(s) for s in out_shapes),
        param_bytes=sum(math.prod(w.shape) * tf.as_dtype(w.dtype).size
                        for w in layer.weights),
        act_bytes=layer_meta.Bytes(out_shapes, dtype))


def BuiltKerasLayer(params: hyperparams.Params, layer: Optional[Any] = None) -> Any:
  """The Keras layer of KerasLayer params (or `layer`, to check in its
  place), checked and built.

  Raises:
    TypeError: if the factory is missing or returns no Keras layer.
    KerasLayerError: if the layer has state the project cannot honour, or
      the params ask for a compute dtype other than float32.
  """
  name = params.name
  if isinstance(params.factory, keras.layers.Layer) or not callable(params.factory):
    raise TypeError(f'KerasLayer {name!r}: p.factory must be a zero-argument callable '
                    f'returning a Keras layer, got {params.factory!r}; for a layer '
                    '`layer`, set factory=lambda: layer.')
  for key in ('dtype', 'fprop_dtype'):
    value = params.Get(key)
    if value is not None and tf.as_dtype(value) != tf.float32:
      raise KerasLayerError(
          f'KerasLayer {name!r}: {key}={tf.as_dtype(value).name} (set on it or '
          'inherited from a layer around it); Keras layers run in float32 only for '
          f'now: leave {key} unset on the layers around Keras layers.')
  if layer is None:
    layer = (_ModelLayer(params.factory, params.model_layer, name) if params.model_layer
             else params.factory())
  if not isinstance(layer, keras.layers.Layer):
    raise TypeError(f'KerasLayer {name!r}: p.factory returned {type(layer).__name__}, '
                    'not a Keras layer.')
  for sub in _SubLayers(layer):
    keras_refusals.CheckSupported(sub, name)
  if not layer.built:
    if params.input_shapes is None:
      raise ValueError(f'{keras_refusals.What(name, layer)} is not built; set p.input_shapes '
                       '(e.g. [[None, 16]]) or build it before.')
    layer(*[keras.KerasTensor(tuple(tf.TensorShape(s).as_list()))
            for s in params.input_shapes])
    for sub in _SubLayers(layer):  # sublayers built by the call
      keras_refusals.CheckSupported(sub, name)
  keras_refusals.CheckWeights(layer, name)
  return layer


_SHARED_MODELS: Dict[type, Any] = {}


def SharedModel(model_class: type) -> Any:
  """The process's one instance of a Keras model class (NewModel), made on
  first use: the model every KerasLayer with that class as factory (and
  model_layer set) calls a layer of, and the one to copy weights from or
  into."""
  if model_class not in _SHARED_MODELS:
    _SHARED_MODELS[model_class] = NewModel(model_class)
  return _SHARED_MODELS[model_class]


def NewModel(model_class: type) -> Any:
  """A new instance of a Keras model class, checked.

  Raises:
    TypeError: if model_class is not a keras.Model subclass.
    KerasLayerError: if its instance is not built.
  """
  if not (isinstance(model_class, type) and issubclass(model_class, keras.Model)):
    raise TypeError(f'{model_class!r} is not a Keras model class; a KerasLayer with '
                    'model_layer set takes the class of a keras.Model as factory.')
  model = model_class()
  if not model.built:
    raise KerasLayerError(f'Keras model class {model_class.__name__} makes an unbuilt '
                          'model; build it in its constructor (start a Sequential '
                          'with keras.Input(shape)) so its layers have weights.')
  return model


def _ModelLayer(model_class: type, layer_name: str, name: str) -> Any:
  """The layer named layer_name of the model class's shared instance."""
  model = SharedModel(model_class)
  names = [l.name for l in model.layers]
  if layer_name not in names:
    raise KerasLayerError(f'KerasLayer {name!r}: Keras model {model.name!r} '
                          f'({model_class.__name__}) has no layer {layer_name!r}; its '
                          f'layers: {names}.')
  return model.get_layer(layer_name)


def _CheckInputSpec(layer: Any, shapes: Sequence[tf.TensorShape]) -> None:
  """Raises ValueError where `shapes` break the layer's input_spec (rank,
  fixed dims), which Keras checks in __call__ but not in compute_output_spec."""
  specs = layer.input_spec
  if specs is None:
    return
  specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
  for spec, shape in zip(specs, shapes):
    if spec is None or shape.rank is None:
      continue
    if spec.ndim is not None and shape.rank != spec.ndim:
      raise ValueError(f'expected inputs of rank {spec.ndim}, got {shape}')
    if spec.min_ndim is not None and shape.rank < spec.min_ndim:
      raise ValueError(f'expected inputs of rank >= {spec.min_ndim}, got {shape}')
    for axis, size in (spec.axes or {}).items():
      if size is not None and shape[axis] not in (None, size):
        raise ValueError(f'expected dim {axis} of the inputs to be {size}, got {shape}')


def _SubLayers(layer: Any) -> List[Any]:
  """The layer and its sublayers, recursively: Keras's own walk, which
  Keras has no public name for."""
  walk = layer._flatten_layers  # pylint: disable=protected-access
  return list(walk(include_self=True, recursive=True))


def _WeightNames(layer: Any, name: str) -> List[str]:
  """Each weight's variable name: its Keras path inside `layer`, with '/'
  written '__' ('mha/query/kernel' -> 'mha__query__kernel')."""
  prefix = f'{layer.path}/'
  names = []
  for w in layer.weights:
    if not w.path.startswith(prefix):
      raise KerasLayerError(
          f'{keras_refusals.What(name, layer)}: weight {w.path!r} lies outside the layer\'s path '
          f'{layer.path!r} (a weight shared with another layer?); tied weights '
          'across Keras layers are not supported.')
    var_name = w.path[len(prefix):].replace('/', '__')
    if not var_name.isidentifier():
      raise KerasLayerError(
          f'{keras_refusals.What(name, layer)}: weight path {w.path!r} makes the variable name '
          f'{var_name!r}, not an identifier; name the Keras (sub)layers with '
          'letters, digits and underscores.')
    names.append(var_name)
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise KerasLayerError(f'{keras_refusals.What(name, layer)}: several weights are named {repeated}; '
                          'give its sublayers distinct names.')
  return names


def _Initializer(w: Any, sublayers: List[Any]) -> Any:
  """The Keras initializer of weight `w`: the `<name>_initializer` of the
  innermost sublayer that owns it (Dense.kernel_initializer), or None."""
  owners = [s for s in sublayers if s.path and w.path.startswith(s.path + '/')]
  if not owners:
    return None
  owner = max(owners, key=lambda s: len(s.path))
  return getattr(owner, f'{w.name}_initializer', None)


def _WeightInit(init: Any) -> Optional[hyperparams.Params]:
  """The WeightInit drawing from the same distribution as Keras initializer
  `init`, or None (the layer's params_init) where there is none. The values
  differ from Keras's (they are a pure function of the variable's path):
  copy a Keras model's own with CopyWeightsFromKeras."""
  inits = keras.initializers
  if isinstance(init, inits.Zeros):
    return weights.WeightInit.Constant(0.0)
  if isinstance(init, inits.Ones):
    return weights.WeightInit.Constant(1.0)
  if isinstance(init, inits.Constant) and isinstance(init.value, (int, float)):
    return weights.WeightInit.Constant(float(init.value))
  if isinstance(init, inits.VarianceScaling) and getattr(init, 'input_axes', None) is None:
    scale = math.sqrt(init.scale)
    if (init.mode, init.distribution) == ('fan_avg', 'uniform'):
      return weights.WeightInit.Xavier(scale)
    if (init.mode, init.distribution) == ('fan_in', 'untruncated_normal'):
      return weights.WeightInit.GaussianSqrtFanIn(scale)
  if isinstance(init, inits.RandomNormal) and init.mean == 0:
    return weights.WeightInit.Gaussian(init.stddev)
  if isinstance(init, inits.RandomUniform) and init.minval == -init.maxval:
    return weights.WeightInit.Uniform(init.maxval)
  return None


def _TakesTraining(layer: Any) -> bool:
  return 'training' in inspect.signature(layer.call).parameters
