"""Transparency: a pipeline equals its layers rebuilt without the partition.

`CheckTransparent` runs one training step of a PipeliningLayer and of a
`Reference` that rebuilds the pipeline's layers from its params (p.layers,
or the sublayers of the cell_tpl cells one after another) and applies them
one after another to each micro-batch with plain autodiff: no cells, cell
runners, schedule or custom gradient. Which layers exist and in what order
come from the params, never from the pipeline's cells, so a partition that
drops, duplicates or reorders a layer fails the check.
"""

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import pipelined_model

from tests.pipeline import pipeline_models as models

RTOL, ATOL = 1e-5, 1e-6

# The base params a layer takes from its parent while it leaves them at
# their defaults (BaseLayer.CreateChild): every base param but the name.
_INHERITED = tuple(k for k in base_layer.BaseLayer.Params().GetKeys()
                   if k not in ('cls', 'name'))


@dataclasses.dataclass
class Result:
  """One training step of the reference.

  Attributes:
    y: the outputs, micro-batches merged as the pipeline merges them.
    loss: loss_fn(y).
    grads: gradients of the pipeline's trainable variables (in
      pipe.trainable_variables order), then of the float inputs.
    bn_inputs: per batch-norm layer path, its input in each micro-batch.
  """
  y: Any
  loss: tf.Tensor
  grads: List[Optional[tf.Tensor]]
  bn_inputs: Dict[str, List[np.ndarray]]


def LayerParams(p: hyperparams.Params
                ) -> List[Tuple[hyperparams.Params, Optional[hyperparams.Params]]]:
  """(layer params, params of its cell_tpl cell or None) of every layer of
  the pipeline with params p, in order, before any partition."""
  if p.layers:
    return [(lp, None) for lp in p.layers]
  layers = []
  for k, cp in enumerate(p.cell_tpl):
    if 'sub' not in cp or not cp.sub:
      raise ValueError(f'cell_tpl[{k}] ({cp.cls.__name__}) has no sublayers; the '
                       'reference rebuilds cells that list theirs in p.sub.')
    layers += [(lp, cp) for lp in cp.sub]
  return layers


class Reference:
  """The pipeline's layers, rebuilt from its params and applied one after
  another to each micro-batch (step seed [step, index of its first
  example] in each micro-batch, batch
  norm on the micro-batch), without the pipeline's machinery.

  A dropout mask is a function of the layer's path, so each layer is built
  at the path of its namesake in the pipeline, with the base params
  (random_seed, dtype...) the pipeline passes down to it; its variables
  start as copies of the pipeline's, matched by name. Only that path is
  read from the pipeline. A layer the pipeline lacks or has twice, or a
  variable on one side only, fails an assertion naming it.
  """

  def __init__(self, pipe: gpipe.PipeliningLayer) -> None:
    self.pipe = pipe
    self.batch_dim = pipe.params.batch_dim
    self.broadcast = _TopLevelIndices(pipe.params.broadcast_inputs, 'broadcast_inputs')
    self.summed = _TopLevelIndices(pipe.params.summed_outputs, 'summed_outputs')
    paths = _PipelinePaths(pipe)
    self.layers = []
    for lp, cell_p in LayerParams(pipe.params):
      found = paths.get(lp.name, [])
      assert len(found) == 1, (
          f'The pipeline has {len(found)} layers named {lp.name!r} ({found}); its '
          f'params list one. All its layers: {sorted(paths)}.')
      lp = lp.Copy()
      for parent in (cell_p, pipe.params):
        if parent is not None:
          _Inherit(lp, parent)
      with tf.name_scope(found[0].rsplit('/', 1)[0] + '/'):
        self.layers.append(lp.Instantiate())
    self.variables = _ByName(v for layer in self.layers for v in layer.variables)
    pipe_vars = _ByName(pipe.variables)
    missing, extra = set(self.variables) - set(pipe_vars), set(pipe_vars) - set(self.variables)
    assert not missing and not extra, (
        f'Variables only in the reference: {sorted(missing)}; only in the '
        f'pipeline: {sorted(extra)}.')
    for name, v in self.variables.items():
      v.assign(pipe_vars[name])
    self.bn_inputs: Dict[str, List[np.ndarray]] = {}

  def Forward(self, inputs: Sequence[tf.Tensor], num_micro: int, step: int) -> Any:
    """The outputs for `inputs` split into num_micro micro-batches."""
    outs = []
    split = [i for i in range(len(inputs)) if i not in self.broadcast]
    micro_size = tf.nest.flatten(inputs[split[0]])[0].shape[self.batch_dim] // num_micro
    for m, micro in enumerate(_Split(inputs, num_micro, self.batch_dim,
                                      self.broadcast)):
      h = tuple(micro)
      for layer in self.layers:
        self._RecordBatchNormInput(layer, h)
        theta = step_seeds.WithStepSeed(layer.theta, [step, m * micro_size])
        h = containers.AsTuple(layer.FProp(theta, *h))
      outs.append(h)
    return containers.UnwrapSingle(_Merge(outs, self.batch_dim, self.summed))

  def TrainStep(self, inputs: Sequence[tf.Tensor], num_micro: int, step: int,
                loss_fn: Callable[[Any], tf.Tensor] = models.Loss) -> Result:
    """Outputs, loss and gradients of one step (plain autodiff)."""
    self.bn_inputs = {}
    float_inputs = models.FloatInputs(inputs)
    variables = [self.variables[v.name] for v in self.pipe.trainable_variables]
    with tf.GradientTape() as tape:
      tape.watch(float_inputs)
      y = self.Forward(inputs, num_micro, step)
      loss = loss_fn(y)
    grads = tape.gradient(loss, variables + float_inputs)
    return Result(y, loss, grads, self.bn_inputs)

  def _RecordBatchNormInput(self, layer: base_layer.BaseLayer, h: tuple) -> None:
    inner = layer.body if isinstance(layer, pipelined_model.CarryLayer) else layer
    if isinstance(inner, normalization.BatchNormLayer):
      self.bn_inputs.setdefault(inner.path, []).append(h[0].numpy())


def CheckTransparent(pipe: gpipe.PipeliningLayer, inputs: Sequence[tf.Tensor],
                     num_micro: int, step: int = 7,
                     loss_fn: Callable[[Any], tf.Tensor] = models.Loss,
                     train_step: Optional[Callable[..., Any]] = None,
                     eager: bool = False) -> Result:
  """Asserts that one training step of `pipe` (train_step, by default
  models.TrainStep) equals the Reference's with num_micro micro-batches:
  outputs, loss, and the gradient of every trainable variable and float
  input (rtol 1e-5). Returns the reference's step."""
  ref = Reference(pipe).TrainStep(inputs, num_micro, step, loss_fn)
  step_fn = train_step or models.TrainStep(pipe, step, loss_fn, eager=eager)
  y, loss, grads = step_fn(*inputs)
  AssertClose(y, ref.y, 'outputs')
  AssertClose(loss, ref.loss, 'loss')
  names = [v.name for v in pipe.trainable_variables] + [
      f'float input {i}' for i in range(len(models.FloatInputs(inputs)))]
  assert len(grads) == len(ref.grads) == len(names), (len(grads), len(ref.grads))
  sources = list(pipe.trainable_variables) + models.FloatInputs(inputs)
  for name, source, g, rg in zip(names, sources, grads, ref.grads):
    # A None gradient (e.g. of paddings that only mask) is a zero one.
    AssertClose(tf.zeros_like(source) if g is None else g,
                tf.zeros_like(source) if rg is None else rg, f'gradient of {name}')
  return ref


def CheckTransparentWithLoss(pipe: gpipe.PipeliningLayer, inputs: Sequence[tf.Tensor],
                             num_micro: int, step: int = 7,
                             loss_inside: bool = True, eager: bool = False,
                             labels: Optional[tf.Tensor] = None) -> Result:
  """CheckTransparent of a step with the loss inside the pipeline
  (models.TrainStepWithLoss) against the reference's whole-batch loss:
  models.Loss, or with the Transformer stack's `labels` models.TokenLoss;
  with loss_inside False, through FProp and the same loss outside."""
  train_step = (models.TrainStepWithLoss(pipe, step, num_micro, eager=eager, labels=labels)
                if loss_inside else None)
  loss_fn = models.Loss if labels is None else models.TokenLoss(labels)
  return CheckTransparent(pipe, inputs, num_micro, step=step,
                          loss_fn=loss_fn, train_step=train_step, eager=eager)


def AssertClose(actual: Any, expected: Any, what: str = '') -> None:
  """Tensors, or structures (tuples, dicts) of them, equal to rtol 1e-5,
  atol 1e-6."""
  pairs = [(actual, expected)]
  if isinstance(actual, (tuple, list, dict)):
    tf.nest.assert_same_structure(actual, expected)
    pairs = zip(tf.nest.flatten(actual), tf.nest.flatten(expected))
  for a, e in pairs:
    np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                               tf.convert_to_tensor(e).numpy(),
                               rtol=RTOL, atol=ATOL, err_msg=what)


def _PipelinePaths(pipe: gpipe.PipeliningLayer) -> Dict[str, List[str]]:
  """Name -> paths of the pipeline's layers with that name; for a cell_tpl
  cell of its own class (one layer of the pipeline, holding the ones its
  params list), those of its sublayers too, under names no layer of the
  pipeline has."""
  paths: Dict[str, List[str]] = {}
  nested: Dict[str, List[str]] = {}
  for layer in pipe.layers:
    paths.setdefault(layer.params.name, []).append(layer.path)
    if type(layer) is not containers.SequentialLayer and 'sub' in layer.params:
      for _, sub in layer.Children():
        nested.setdefault(sub.params.name, []).append(sub.path)
  return {**nested, **paths}


def _Inherit(child: hyperparams.Params, parent: hyperparams.Params) -> None:
  """Sets the child's base params left at their defaults to the parent's."""
  defaults = base_layer.BaseLayer.Params()
  for key in _INHERITED:
    if child.Get(key) == defaults.Get(key):
      child.Set(**{key: parent.Get(key)})


def _ByName(variables: Iterable[tf.Variable]) -> Dict[str, tf.Variable]:
  by_name: Dict[str, tf.Variable] = {}
  for v in variables:
    assert v.name not in by_name, f'Two variables are named {v.name!r}.'
    by_name[v.name] = v
  return by_name


def _TopLevelIndices(entries: Sequence[Any], name: str) -> Set[int]:
  """The input (or output) indices a pipeline declares in `name`; the
  reference takes flat tensors, so only whole top-level entries."""
  indices = set()
  for entry in entries:
    assert str(entry).isdigit(), (
        f'The reference handles only top-level entries of {name}, got {entry!r}.')
    indices.add(int(entry))
  return indices


def _Split(inputs: Sequence[tf.Tensor], num_micro: int, batch_dim: int,
           broadcast: Set[int]) -> List[list]:
  """Per micro-batch the inputs: the declared broadcast ones whole, the
  others split along batch_dim."""
  columns = [[x] * num_micro if i in broadcast else
             tf.split(x, num_micro, axis=batch_dim) for i, x in enumerate(inputs)]
  return [list(row) for row in zip(*columns)]


def _Merge(outs: List[tuple], batch_dim: int, summed: Set[int]) -> tuple:
  """Per output: summed over micro-batches if declared so, else
  concatenated along batch_dim."""
  return tuple(tf.add_n(list(column)) if i in summed else
               tf.concat(column, axis=batch_dim)
               for i, column in enumerate(zip(*outs)))


def CheckMovingAverages(pipe: Any, bn_inputs: Dict[str, List[np.ndarray]]) -> None:
  """The pipeline's batch-norm moving averages after one step equal NumPy's
  update from the inputs of all micro-batches (models.ExpectedMovingAverages)."""
  expected = models.ExpectedMovingAverages(bn_inputs, models.BN_DECAY)
  assert expected, 'no batch-norm inputs recorded'
  variables = {v.name: v for v in pipe.variables}
  for path, (mean, var) in expected.items():
    AssertClose(variables[f'{path}/moving_mean:0'], mean)
    AssertClose(variables[f'{path}/moving_variance:0'], var)
