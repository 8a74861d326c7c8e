"""The params every layer has besides its name, and how a child inherits
them from its parent."""

from typing import Any, TypeVar

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import weights

_P = TypeVar('_P', bound=hyperparams.Params)

# The base params a child inherits from its parent while its own are unset.
INHERITED = ('dtype', 'fprop_dtype', 'params_init', 'random_seed',
             'skip_lp_regularization')


def Define(p: _P) -> _P:
  """Defines the inherited base params in `p` (BaseLayer.Params); returns it."""
  p.Define('dtype', tf.float32, 'Dtype of the variables.')
  p.Define('fprop_dtype', None, 'Dtype of activations; None: dtype.')
  p.Define('params_init', weights.WeightInit.Xavier(1.0),
           'Default initializer of weights (WeightInit params).')
  p.Define('random_seed', None, 'Seed mixed into initialization and dropout '
           'seeds (with the layer path); None: 0.')
  p.Define('skip_lp_regularization', None,
           'If True, the variables of this layer skip L1/L2 regularization.')
  return p


def InheritBaseParams(child: hyperparams.Params,
                      parent: hyperparams.Params) -> None:
  """Sets, in place, the base params of `child` (dtype, fprop_dtype,
  params_init, random_seed, skip_lp_regularization) that are at their
  defaults to those of `parent`, as CreateChild does."""
  defaults = Define(hyperparams.Params())
  for key in INHERITED:
    if key in child and key in parent and child.Get(key) == defaults.Get(key):
      child.Set(**{key: parent.Get(key)})


def WithInheritedBaseParams(params: hyperparams.Params) -> hyperparams.Params:
  """A copy of layer params in which every nested layer's params (also in
  lists) have inherited the base params of the layer params around them,
  as they would when built: what FPropMeta and the planner must read, e.g.
  the compute dtype set once on a task."""
  out = params.Copy()
  _InheritDown(out)
  return out


def _IsLayerParams(value: Any) -> bool:
  """Params of something instantiable that has every base param: a layer's."""
  return isinstance(value, hyperparams.InstantiableParams) and all(
      key in value for key in INHERITED)


def _InheritDown(parent: hyperparams.Params) -> None:
  for _, value in parent.IterParams():
    children = value if isinstance(value, (list, tuple)) else [value]
    for child in children:
      if _IsLayerParams(child):
        if _IsLayerParams(parent):
          InheritBaseParams(child, parent)
        _InheritDown(child)
      elif isinstance(child, hyperparams.Params):
        _InheritDown(child)
