"""The tensors a training-step loop carries (loop_executor): specs of a
nest, zeros, unset tensors, TensorArrays of specs, and the loop's initial
state."""

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.pipeline import loop_tables


def Specs(nest: Any) -> List[tf.TensorSpec]:
  """The TensorSpec of each tensor of `nest`, flat."""
  return [tf.TensorSpec(t.shape, t.dtype) for t in tf.nest.flatten(nest)]


def Zeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def Unset(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """Tensors of `specs` whose values nobody reads (a loop writes them to a
  spare slot): allocated, not set, and never folded into constants, which
  would hold their memory between steps as zeros do."""
  return [tf.raw_ops.Empty(shape=s.shape.as_list(), dtype=s.dtype) for s in specs]


def Arrays(specs: Sequence[tf.TensorSpec], size: int) -> List[tf.TensorArray]:
  """A TensorArray of `size` elements per spec, readable more than once."""
  return [tf.TensorArray(s.dtype, size=size, element_shape=s.shape,
                         clear_after_read=False) for s in specs]


def Stacked(nests: Sequence[Any], device: str) -> List[tf.Tensor]:
  """Per flat position of the nests (alike), their tensors stacked, on
  `device`."""
  with tf.device(device):
    return [tf.stack(list(column)) for column in zip(*[tf.nest.flatten(x) for x in nests])]


def Unstacked(array: tf.TensorArray, size: int) -> List[tf.Tensor]:
  """Elements 0 .. size-1 of `array` (its spare slots left out)."""
  return tf.unstack(array.gather(list(range(size))), size)


def InitialState(devices: Sequence[Sequence[str]], rings: loop_tables.Rings,
                 num_micro: int, out_specs: Sequence[List[tf.TensorSpec]],
                 upd_specs: Sequence[List[tf.TensorSpec]], in_specs: List[tf.TensorSpec],
                 factor_specs: Sequence[List[tf.TensorSpec]],
                 loss_spec: Optional[tf.TensorSpec]) -> Dict[str, Any]:
  """The arrays and sums a loop step carries, per lane (replica r's cell c
  on devices[r][c]) or per replica: each cell's out_specs, upd_specs and
  factor_specs, the pipeline's in_specs; loss_spec None without the loss
  inside (the last cell's output gradients then come from outside)."""
  last = len(out_specs) - 1
  dy_size = rings.loss_gradients + 1 if loss_spec is not None else num_micro + 1
  state: Dict[str, Any] = dict(acts=[], grads=[], factors=[], sums=[], dys=[], outs=[],
                               d_inputs=[], losses=[])
  for row in devices:
    for c, device in enumerate(row):
      with tf.device(device):
        for key, depths in (('acts', rings.activations), ('grads', rings.gradients)):
          state[key].append(Arrays(out_specs[c], depths[c] + 1) if c < last else [])
        state['factors'].append(Arrays(factor_specs[c], num_micro + 1))
        state['sums'].append(Zeros(upd_specs[c]))
    with tf.device(row[-1]):
      state['dys'].append(Arrays(out_specs[last], dy_size))
      state['outs'].append(Arrays(out_specs[last], num_micro + 1))
      if loss_spec is not None:
        state['losses'].append(tf.zeros([], loss_spec.dtype))
    with tf.device(row[0]):
      state['d_inputs'].append(Arrays(in_specs, num_micro + 1))
  return state
