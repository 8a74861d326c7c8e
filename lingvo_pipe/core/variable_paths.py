"""A model's variables by path: the names it is checkpointed and restored by.

A variable's path is the chain of layer names from the model down to it,
relative to the model: 'stack/pipeline/layer_3/ffn/w'. Paths come from the
logical model (a PipeliningLayer's layers, not its cells), so they do not
change with the number of cells, micro-batches, replicas or the schedule.
"""

from typing import Any, Dict

import tensorflow as tf

from lingvo_pipe.core import base_layer


def VariablesByPath(model: base_layer.BaseLayer) -> Dict[str, tf.Variable]:
  """Every variable of `model` and its sublayers, keyed by its path
  relative to `model`, in creation order.

  Raises:
    ValueError: if the model holds a variable that no layer created (it
      would not be checkpointed).
  """
  out: Dict[str, tf.Variable] = {}
  _Collect(model, '', out)
  found = {id(v) for v in out.values()}
  stray = [v.name for v in model.variables if id(v) not in found]
  if stray:
    raise ValueError(f'{model.path!r} holds variables that no layer created '
                     f'with CreateVariable: {stray[:5]}; create them with '
                     'CreateVariable so they are checkpointed.')
  return out


def _Collect(layer: base_layer.BaseLayer, prefix: str,
             out: Dict[str, tf.Variable]) -> None:
  for name, var in layer.vars.items():
    if isinstance(var, tf.Variable):
      out[prefix + name] = var
  for _, child in layer.Children():
    _Collect(child, f'{prefix}{child.params.name}/', out)


def Nested(flat: Dict[str, Any]) -> Dict[str, Any]:
  """{'a/b/w': v} as {'a': {'b': {'w': v}}}: tracked by tf.train.Checkpoint,
  the key of v is then '<attribute>/a/b/w/.ATTRIBUTES/VARIABLE_VALUE'."""
  root: Dict[str, Any] = {}
  for path, value in flat.items():
    node = root
    *parents, leaf = path.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return root
