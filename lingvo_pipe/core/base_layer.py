"""BaseLayer: a tf.Module built from Params, with explicit theta and FProp."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import step_seeds
from lingvo_pipe.core import weights

class BaseLayer(tf.Module):
  """Base class of all layers.

  A layer is built from its Params only. Its constructor creates variables
  (`CreateVariable`) and sublayers (`CreateChild`); after construction the
  layer is a pure function `FProp(theta, *inputs)` of its theta, a NestedMap
  of its variables and its children's thetas. `layer(*inputs)` calls
  `FProp(self.theta, *inputs)`.

  Layers that keep statistics (batch norm) return them from
  `FPropWithUpdates` instead of assigning them, and assign them in
  `ApplyUpdates`, so a pipeline can sum them over micro-batches first.
  """

  # Random layers (dropout) set this: their theta then carries a step seed.
  USES_STEP_SEED = False
  # Layers that return statistics from FPropWithUpdates set this.
  HAS_OWN_UPDATES = False

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Name of the layer: an identifier, used in variable '
             'names and checkpoint keys. Required.')
    return base_params.Define(p)

  def __init__(self, params: hyperparams.Params) -> None:
    if not isinstance(params, hyperparams.Params):
      raise TypeError(f'{type(self).__name__} takes Params, got '
                      f'{type(params).__name__}; build it with '
                      f'{type(self).__name__}.Params().Set(name=...).Instantiate().')
    if not params.name:
      raise ValueError(f'{type(self).__name__} params.name is empty; set it, '
                       f'e.g. p.name = {type(self).__name__.lower()!r}.')
    if not params.name.isidentifier():
      raise ValueError(f'Layer name {params.name!r} must be a Python identifier '
                       '(letters, digits, underscores).')
    self.__dict__['_constructing'] = True
    self.__dict__['_child_names'] = []
    self.__dict__['_var_names'] = []
    super().__init__(name=params.name)
    self._params = params.Copy().Freeze()

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    if '__init__' in cls.__dict__:
      setattr(cls, '__init__', _FinishConstructionAfter(cls.__dict__['__init__']))

  # --- construction ------------------------------------------------------

  @property
  def params(self) -> hyperparams.Params:
    """The layer's frozen params."""
    return self._params

  @property
  def path(self) -> str:
    """Hierarchical name such as 'model/enc/w' without the trailing slash."""
    return self.name_scope.name.rstrip('/')

  @property
  def fprop_dtype(self) -> tf.DType:
    """The dtype of the layer's activations and products (core/precision)."""
    return tf.as_dtype(self.params.fprop_dtype or self.params.dtype)

  def ThetaDtype(self, name: str) -> tf.DType:
    """The dtype in which FProp reads this layer's variable `name`: the
    compute dtype. Layers that compute in float32 whatever fprop_dtype is
    (norms: core/precision) override it to keep their variables float32."""
    del name  # every variable of a layer alike, unless overridden
    return self.fprop_dtype

  def CreateChild(self, name: str, params: hyperparams.Params) -> 'BaseLayer':
    """Builds a sublayer from `params` as attribute `name`; returns it.

    The child is named `name` (its params.name is replaced), so siblings
    always get distinct variable paths, initial weights and dropout seeds.
    """
    self._CheckConstructing('CreateChild', name)
    self._CheckNewName(name)
    child = self._BuildChild(name, params)
    self._child_names.append(name)
    setattr(self, name, child)
    return child

  def CreateChildren(self, name: str,
                     params: Union[Sequence[hyperparams.Params],
                                   Dict[str, hyperparams.Params]],
                     devices: Optional[Sequence[str]] = None) -> Any:
    """Builds a list (or dict) of sublayers as attribute `name`.

    A child whose params.name is empty or shared with a sibling is named
    '<name>_<index or key>', so every variable path stays unique.
    `devices`, if given, names per child (in order) the device its
    variables are created on.
    """
    self._CheckConstructing('CreateChildren', name)
    self._CheckNewName(name)
    items: List[Tuple[Any, hyperparams.Params]] = (
        list(params.items()) if isinstance(params, dict) else list(enumerate(params)))
    if isinstance(params, dict):
      for key in params:
        _CheckThetaKey(key, f'{self.path}/{name}')
    given = [_GivenName(p) for _, p in items]
    if devices is not None and len(devices) != len(items):
      raise ValueError(f'CreateChildren({name!r}) in {self.path!r}: '
                       f'{len(devices)} devices for {len(items)} children.')
    built = []
    for index, ((key, p), child_name) in enumerate(zip(items, given)):
      if not child_name or given.count(child_name) > 1:
        child_name = f'{name}_{key}'
      placement = (tf.device(devices[index]) if devices is not None
                   else contextlib.nullcontext())
      with placement:
        built.append((key, self._BuildChild(child_name, p)))
    children: Any = dict(built) if isinstance(params, dict) else [c for _, c in built]
    self._child_names.append(name)
    setattr(self, name, children)
    return getattr(self, name)

  def _BuildChild(self, name: str, params: hyperparams.Params) -> 'BaseLayer':
    if not isinstance(params, hyperparams.Params) or 'cls' not in params:
      raise TypeError(f'Child {name!r} of {self.path!r} needs layer Params '
                      f'(with cls), got {type(params).__name__}.')
    p = params.Copy()
    p.name = name
    self._CopyBaseParams(p)
    with self.name_scope:
      return p.Instantiate()

  def _CopyBaseParams(self, child: hyperparams.Params) -> None:
    base_params.InheritBaseParams(child, self.params)

  def CreateVariable(self, name: str, var_params: hyperparams.Params,
                     trainable: bool = True) -> tf.Variable:
    """Creates variable `name` (see weights.WeightParams); returns it.

    Its initial value is a pure function of the variable path and
    params.random_seed, so equal models get equal weights.
    """
    self._CheckConstructing('CreateVariable', name)
    self._CheckNewName(name)
    p = self.params
    dtype = var_params.dtype or p.dtype
    init = var_params.init or p.params_init
    if 'non_trainable' in var_params.collections:
      trainable = False
    with self.name_scope:
      path = f'{self.path}/{name}'
      value = weights.InitialValue(init, var_params.shape, dtype,
                                   weights.PathSeed(path, p.random_seed))
      var = tf.Variable(value, name=name, trainable=trainable)
    self._var_names.append(name)
    setattr(self, name, var)
    return var

  def _CheckConstructing(self, what: str, name: str) -> None:
    if not self.__dict__.get('_constructing', False):
      raise RuntimeError(
          f'{what}({name!r}) called on {self.path!r} after its constructor '
          'finished; create variables and sublayers only in __init__.')

  def _CheckNewName(self, name: str) -> None:
    if not name.isidentifier():
      raise ValueError(f'Name {name!r} in {self.path!r} must be an identifier.')
    if name in self._child_names or name in self._var_names:
      raise ValueError(f'{self.path!r} already has a child or variable named '
                       f'{name!r}.')
    if hasattr(type(self), name) or name in self.__dict__:
      raise ValueError(f'Name {name!r} in {self.path!r} is already an attribute '
                       f'of {type(self).__name__}; choose another name.')
    _CheckThetaKey(name, self.path)

  def __setattr__(self, name: str, value: Any) -> None:
    created = name in self.__dict__.get('_child_names', ()) or name in (
        self.__dict__.get('_var_names', ()))
    if not created and _HoldsLayerOrVariable(value):
      raise AttributeError(
          f'{type(self).__name__} {self.__dict__.get("_name", "?")!r}: '
          f'attribute {name!r} holds a layer or variable that was not made '
          'with CreateChild/CreateChildren/CreateVariable; use those so the '
          'layer appears in theta and checkpoints.')
    super().__setattr__(name, value)

  # --- theta and forward -------------------------------------------------

  @property
  def vars(self) -> NestedMap:
    """The variables, mirroring the child hierarchy."""
    return self._Tree(lambda layer: layer.vars,
                      lambda layer, n: getattr(layer, n), with_seed=False)

  @property
  def theta(self) -> NestedMap:
    """What FProp reads: variables, children's thetas, and step seeds."""
    return self._Tree(lambda layer: layer.theta,
                      lambda layer, n: getattr(layer, n), with_seed=True)

  def _Tree(self, child_fn, var_fn, with_seed: bool) -> NestedMap:
    tree = NestedMap()
    for n in self._var_names:
      tree[n] = var_fn(self, n)
    for n in self._child_names:
      child = getattr(self, n)
      if isinstance(child, BaseLayer):
        tree[n] = child_fn(child)
      elif isinstance(child, dict) or hasattr(child, 'items'):
        tree[n] = NestedMap({k: child_fn(c) for k, c in child.items()})
      else:
        tree[n] = [child_fn(c) for c in child]
    if with_seed and self.USES_STEP_SEED:
      tree[step_seeds.KEY] = tf.zeros([2], tf.int64)
    return tree

  def MapTheta(self, theta: NestedMap,
               fn: Callable[['BaseLayer', str, Any], Any]) -> NestedMap:
    """`theta` of this layer with each variable's entry replaced by
    fn(owning layer, variable name, entry), the children's recursively;
    step seeds and any other entries unchanged."""
    out = NestedMap(theta)
    for n in self._var_names:
      if n in theta:
        out[n] = fn(self, n, theta[n])
    for n in self._child_names:
      if n not in theta:
        continue
      child = getattr(self, n)
      if isinstance(child, BaseLayer):
        out[n] = child.MapTheta(theta[n], fn)
      elif isinstance(child, dict) or hasattr(child, 'items'):
        out[n] = NestedMap({k: c.MapTheta(theta[n][k], fn)
                            for k, c in child.items()})
      else:
        out[n] = [c.MapTheta(t, fn) for c, t in zip(child, theta[n])]
    return out

  def Children(self) -> List[Tuple[str, 'BaseLayer']]:
    """(name, layer) of every direct sublayer, in creation order."""
    out = []
    for n in self._child_names:
      child = getattr(self, n)
      if isinstance(child, BaseLayer):
        out.append((n, child))
      elif hasattr(child, 'items'):
        out.extend((f'{n}.{k}', c) for k, c in child.items())
      else:
        out.extend((f'{n}.{i}', c) for i, c in enumerate(child))
    return out

  def Walk(self, enter: Callable[['BaseLayer'], bool] = lambda _: True
           ) -> Iterator['BaseLayer']:
    """This layer, then its sublayers depth-first in creation order; the
    sublayers of a layer for which enter(layer) is False are not visited."""
    yield self
    if enter(self):
      for _, child in self.Children():
        yield from child.Walk(enter)

  def FProp(self, theta: NestedMap, *inputs: Any) -> Any:
    """Forward pass: a pure function of theta and the inputs."""
    raise NotImplementedError(f'{type(self).__name__} does not define FProp.')

  def __call__(self, *inputs: Any) -> Any:
    return self.FProp(self.theta, *inputs)

  def HasUpdates(self) -> bool:
    """True if this layer or a sublayer returns statistics to apply."""
    return self.HAS_OWN_UPDATES or any(c.HasUpdates() for _, c in self.Children())

  def FPropWithUpdates(self, theta: NestedMap, *inputs: Any) -> Tuple[Any, NestedMap]:
    """Returns (FProp outputs, additive statistics for ApplyUpdates).

    The statistics of several calls (micro-batches) may be summed before
    they are applied. Layers that hold updating sublayers override this.
    """
    if self.HasUpdates():
      raise NotImplementedError(
          f'{type(self).__name__} {self.path!r} contains layers with updates '
          '(e.g. batch norm) but does not override FPropWithUpdates; '
          'forward their updates as Sequential does.')
    return self.FProp(theta, *inputs), NestedMap()

  def ApplyUpdates(self, updates: NestedMap) -> List[Any]:
    """Assigns summed statistics from FPropWithUpdates; returns the ops."""
    ops = []
    for name, child in self.Children():
      sub = updates.GetItem(name) if _HasPath(updates, name) else None
      if sub:
        ops.extend(child.ApplyUpdates(sub))
    return ops

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    """Planning metadata for the given input shapes (see LayerMeta)."""
    raise NotImplementedError(
        f'{cls.__name__} does not define FPropMeta, which the automatic partition '
        "(PipeliningLayer's num_partitions) and its input_shapes need: define it, or "
        'split the layers by hand with splits (or cell_tpl) and leave input_shapes unset.')


def _CheckThetaKey(key: Any, where: str) -> None:
  """Raises ValueError unless `key` can name an entry of theta."""
  if key == step_seeds.KEY:
    raise ValueError(f'Name {key!r} in {where!r} is reserved for the step seed '
                     'of random layers; choose another name.')
  try:
    NestedMap({key: None})
  except ValueError as e:
    raise ValueError(f'Name {key!r} in {where!r} cannot key theta: {e}') from None


def _GivenName(params: Any) -> str:
  if isinstance(params, hyperparams.Params) and 'name' in params:
    return params.name
  return ''


def _HasPath(tree: NestedMap, dotted: str) -> bool:
  try:
    tree.GetItem(dotted)
  except (KeyError, IndexError, ValueError):
    return False
  return True


def _HoldsLayerOrVariable(value: Any) -> bool:
  if isinstance(value, (BaseLayer, tf.Variable)):
    return True
  if isinstance(value, (list, tuple)):
    return any(_HoldsLayerOrVariable(v) for v in value)
  if isinstance(value, dict):
    return any(_HoldsLayerOrVariable(v) for v in value.values())
  return False


def _FinishConstructionAfter(init):
  """Wraps a subclass __init__ so the outermost call ends construction."""

  def Wrapped(self, *args, **kwargs):
    outermost = not self.__dict__.get('_init_depth', 0)
    self.__dict__['_init_depth'] = self.__dict__.get('_init_depth', 0) + 1
    try:
      init(self, *args, **kwargs)
    finally:
      self.__dict__['_init_depth'] -= 1
      if outermost:
        self.__dict__['_constructing'] = False

  Wrapped.__wrapped__ = init
  Wrapped.__doc__ = init.__doc__
  return Wrapped


# BaseLayer's own constructor ends construction too, for subclasses that
# define no __init__ of their own.
setattr(BaseLayer, '__init__', _FinishConstructionAfter(BaseLayer.__init__))
