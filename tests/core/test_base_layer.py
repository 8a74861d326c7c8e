"""Tests BaseLayer: construction, naming, theta, purity, checkpoints, step seeds and updates."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import step_seeds
from lingvo_pipe.core import weights

from tests.core.affine_layer import Affine as _Affine


class _Tree(base_layer.BaseLayer):
  """A child, a list of children, a dict of children and a statistics var."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('first', _Affine.Params().Set(input_dim=2, output_dim=3), '')
    p.Define('stack', [_Affine.Params().Set(input_dim=3, output_dim=3)] * 2, '')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('first', p.first)
    self.CreateChildren('stack', p.stack)
    self.CreateChildren('heads', {
        'left': _Affine.Params().Set(input_dim=3, output_dim=1),
        'right': _Affine.Params().Set(input_dim=3, output_dim=2)})
    self.CreateVariable('count', weights.WeightParams(
        [], init=weights.WeightInit.Constant(0.0), collections=['non_trainable']))

  def FProp(self, theta, x):
    x = self.first.FProp(theta.first, x)
    for layer, layer_theta in zip(self.stack, theta.stack):
      x = layer.FProp(layer_theta, x)
    return (self.heads['left'].FProp(theta.heads.left, x),
            self.heads['right'].FProp(theta.heads.right, x))


def _Build(**kwargs):
  return _Tree.Params().Set(name='top', **kwargs).Instantiate()


def _Inputs():
  return tf.constant(np.random.RandomState(0).randn(4, 2).astype(np.float32))


def _NumpyForward(v, x):
  """Reference forward pass on NumPy copies of the weights in `v` (vars tree)."""
  h = x @ v['first']['w'] + v['first']['b']
  for layer in v['stack']:
    h = h @ layer['w'] + layer['b']
  return tuple(h @ v['heads'][k]['w'] + v['heads'][k]['b']
               for k in ('left', 'right'))


def _AsNumpy(tree):
  return tf.nest.map_structure(lambda t: np.array(t), tree)


def test_params_has_base_keys():
  p = base_layer.BaseLayer.Params()
  assert p.GetKeys() == ['cls', 'dtype', 'fprop_dtype', 'name', 'params_init',
                         'random_seed', 'skip_lp_regularization']
  assert p.cls is base_layer.BaseLayer
  assert p.dtype == tf.float32 and p.fprop_dtype is None
  assert p.params_init == weights.WeightInit.Xavier(1.0)
  assert _Affine.Params().cls is _Affine


def test_layer_params_are_a_frozen_copy():
  p = _Affine.Params().Set(name='aff')
  layer = p.Instantiate()
  assert layer.params == p and layer.params is not p
  assert layer.params.IsFrozen() and not p.IsFrozen()
  p.input_dim = 7
  assert layer.params.input_dim == 2


def test_variable_names_are_hierarchical_and_stable():
  names = [v.name for v in _Build().variables]
  expected = ['top/count:0', 'top/first/w:0', 'top/first/b:0',
              'top/stack_0/w:0', 'top/stack_0/b:0', 'top/stack_1/w:0',
              'top/stack_1/b:0', 'top/heads_left/w:0', 'top/heads_left/b:0',
              'top/heads_right/w:0', 'top/heads_right/b:0']
  assert sorted(names) == sorted(expected)
  # No uniquifying suffixes when the same model is built again.
  layer = _Build()
  assert sorted(v.name for v in layer.variables) == sorted(expected)
  assert layer.path == 'top'
  assert layer.first.path == 'top/first'
  assert layer.stack[1].path == 'top/stack_1'
  assert layer.heads['left'].path == 'top/heads_left'


def test_child_names_follow_attributes_and_list_children_keep_given_names():
  p = _Tree.Params()
  p.first.name = 'proj'
  p.stack = [_Affine.Params().Set(input_dim=3, output_dim=3, name=n)
             for n in ('lower', 'upper')]
  layer = p.Set(name='top').Instantiate()
  assert layer.first.w.name == 'top/first/w:0'
  assert layer.first.params.name == 'first'
  assert [c.path for c in layer.stack] == ['top/lower', 'top/upper']


def test_children_list():
  layer = _Build()
  assert [n for n, _ in layer.Children()] == [
      'first', 'stack.0', 'stack.1', 'heads.left', 'heads.right']
  assert layer.Children()[1][1] is layer.stack[0]


def test_theta_mirrors_the_child_hierarchy():
  layer = _Build()
  theta = layer.theta
  assert isinstance(theta, NestedMap)
  assert sorted(theta.keys()) == ['count', 'first', 'heads', 'stack']
  assert sorted(theta.first.keys()) == ['b', 'w']
  assert isinstance(theta.stack, list) and len(theta.stack) == 2
  assert isinstance(theta.heads, NestedMap)
  assert sorted(theta.heads.keys()) == ['left', 'right']
  assert theta.first.w is layer.first.w
  assert theta.stack[1].b is layer.stack[1].b
  assert theta.heads.right.w is layer.heads['right'].w
  assert [k for k, _ in theta.FlattenItems()] == [
      k for k, _ in layer.vars.FlattenItems()]
  assert len(theta.Flatten()) == len(layer.variables) == 11


def test_non_trainable_collection():
  layer = _Build()
  assert not layer.count.trainable
  assert layer.first.w.trainable
  assert len(layer.trainable_variables) == 10


def _AssertOutputsClose(outputs, reference):
  for got, want in zip(outputs, reference):
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-6)


def test_fprop_is_pure_in_theta():
  layer = _Build()
  x = _Inputs()
  before = _AsNumpy(layer.vars)
  _AssertOutputsClose(layer.FProp(layer.theta, x),
                      _NumpyForward(before, x.numpy()))
  doubled = layer.theta.Transform(lambda v: v * 2.0)
  _AssertOutputsClose(
      layer.FProp(doubled, x),
      _NumpyForward(tf.nest.map_structure(lambda v: 2.0 * v, before), x.numpy()))
  # The variables are untouched.
  tf.nest.map_structure(np.testing.assert_array_equal, _AsNumpy(layer.vars),
                        before)


def test_call_uses_self_theta():
  layer = _Build()
  x = _Inputs()
  layer.first.w.assign(tf.ones_like(layer.first.w))
  _AssertOutputsClose(layer(x), _NumpyForward(_AsNumpy(layer.vars), x.numpy()))


def test_fprop_in_tf_function_equals_eager_and_differentiates_theta():
  layer = _Build()
  x = _Inputs()

  @tf.function
  def Loss(theta):
    left, right = layer.FProp(theta, x)
    return tf.reduce_sum(left) + tf.reduce_sum(right**2)

  theta = layer.theta
  eager = Loss.python_function(theta)
  np.testing.assert_allclose(Loss(theta).numpy(), eager.numpy(), rtol=1e-6)
  with tf.GradientTape() as tape:
    loss = Loss(theta)
  grads = tape.gradient(loss, theta)
  assert grads.count is None  # Not used by FProp.
  assert grads.first.w.shape == layer.first.w.shape


def test_equal_params_give_equal_weights_and_paths_differ():
  a, b = _Build(), _Build()
  for (ka, va), (kb, vb) in zip(a.vars.FlattenItems(), b.vars.FlattenItems()):
    assert ka == kb
    np.testing.assert_array_equal(va.numpy(), vb.numpy())
  # Same shapes, different paths: different values.
  assert not np.array_equal(a.stack[0].w.numpy(), a.stack[1].w.numpy())
  other_name = _Tree.Params().Set(name='other').Instantiate()
  assert not np.array_equal(a.first.w.numpy(), other_name.first.w.numpy())


def test_random_seed_changes_weights_and_is_inherited():
  a, b = _Build(), _Build(random_seed=5)
  assert b.first.params.random_seed == 5
  assert b.heads['left'].params.random_seed == 5
  assert not np.array_equal(a.first.w.numpy(), b.first.w.numpy())
  c = _Build(random_seed=5)
  np.testing.assert_array_equal(b.first.w.numpy(), c.first.w.numpy())


def test_children_inherit_unset_base_params():
  p = _Tree.Params().Set(name='top', dtype=tf.float64,
                         params_init=weights.WeightInit.Constant(0.25),
                         fprop_dtype=tf.float64, skip_lp_regularization=True)
  p.first.random_seed = 9  # Set on the child: kept.
  layer = p.Instantiate()
  for _, child in layer.Children():
    assert child.params.dtype == tf.float64
    assert child.params.fprop_dtype == tf.float64
    assert child.params.skip_lp_regularization is True
    assert child.w.dtype == tf.float64
    np.testing.assert_array_equal(child.w.numpy(), 0.25)  # Parent's init.
    np.testing.assert_array_equal(child.b.numpy(), 0.5)   # Its own init.
  assert layer.first.params.random_seed == 9
  assert layer.stack[0].params.random_seed is None
  assert layer.fprop_dtype == tf.float64


def test_child_set_params_are_not_overridden():
  p = _Tree.Params().Set(name='top', dtype=tf.float64)
  p.first.params_init = weights.WeightInit.Constant(2.0)
  p.first.fprop_dtype = tf.bfloat16
  layer = p.Instantiate()
  np.testing.assert_array_equal(layer.first.w.numpy(), 2.0)
  assert layer.first.fprop_dtype == tf.bfloat16
  assert layer.stack[0].fprop_dtype == tf.float64  # dtype, as fprop_dtype unset.


def test_checkpoint_keys_are_readable_and_restore(tmp_path):
  layer = _Build()
  path = tf.train.Checkpoint(model=layer).write(str(tmp_path / 'ckpt'))
  keys = {k for k, _ in tf.train.list_variables(path)}
  suffix = '/.ATTRIBUTES/VARIABLE_VALUE'
  for key in ('model/first/w', 'model/first/b', 'model/stack/0/w',
              'model/stack/1/b', 'model/heads/left/w', 'model/heads/right/b',
              'model/count'):
    assert key + suffix in keys
  assert len([k for k in keys if k.endswith(suffix)]) == 11
  other = _Build(random_seed=123)
  assert not np.array_equal(other.first.w.numpy(), layer.first.w.numpy())
  tf.train.Checkpoint(model=other).read(path).assert_consumed()
  tf.nest.map_structure(np.testing.assert_array_equal, _AsNumpy(other.vars),
                        _AsNumpy(layer.vars))


class _Noise(base_layer.BaseLayer):
  """Adds step-seeded noise: a stand-in for dropout."""
  USES_STEP_SEED = True

  def FProp(self, theta, x):
    seed = theta.step_seed + [0, self.params.random_seed or 0]
    return x + tf.random.stateless_uniform(tf.shape(x), seed)


class _NoisyStack(base_layer.BaseLayer):

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('aff', _Affine.Params().Set(input_dim=2, output_dim=2))
    self.CreateChildren('noise', [_Noise.Params(), _Noise.Params()])

  def FProp(self, theta, x):
    x = self.aff.FProp(theta.aff, x)
    for layer, layer_theta in zip(self.noise, theta.noise):
      x = layer.FProp(layer_theta, x)
    return x


def test_step_seed_in_theta_and_with_step_seed():
  layer = _NoisyStack.Params().Set(name='top').Instantiate()
  theta = layer.theta
  assert 'step_seed' not in theta and 'step_seed' not in theta.aff
  for sub in theta.noise:
    assert sub.step_seed.dtype == tf.int64
    assert sub.step_seed.numpy().tolist() == [0, 0]
  seeded = step_seeds.WithStepSeed(theta, [5, 2])
  assert [s.step_seed.numpy().tolist() for s in seeded.noise] == [[5, 2], [5, 2]]
  assert seeded.aff.w is layer.aff.w  # Variables are passed through.
  assert theta.noise[0].step_seed.numpy().tolist() == [0, 0]  # Not mutated.
  x = _Inputs()
  a = layer.FProp(seeded, x)
  np.testing.assert_array_equal(
      a.numpy(), layer.FProp(step_seeds.WithStepSeed(theta, [5, 2]), x).numpy())
  b = layer.FProp(step_seeds.WithStepSeed(theta, [6, 2]), x)
  assert not np.array_equal(a.numpy(), b.numpy())


def test_with_step_seed_accepts_tensors_in_tf_function():
  layer = _NoisyStack.Params().Set(name='top').Instantiate()

  @tf.function
  def Run(step):
    theta = step_seeds.WithStepSeed(layer.theta, tf.stack([step, 1]))
    return theta.noise[1].step_seed

  assert Run(tf.constant(3, tf.int32)).numpy().tolist() == [3, 1]


def test_eval_mode_nesting():
  assert not eval_mode.IsEvalMode()
  with eval_mode.EvalMode():
    assert eval_mode.IsEvalMode()
    with eval_mode.EvalMode(False):
      assert not eval_mode.IsEvalMode()
      with eval_mode.EvalMode():
        assert eval_mode.IsEvalMode()
      assert not eval_mode.IsEvalMode()
    assert eval_mode.IsEvalMode()
  assert not eval_mode.IsEvalMode()
  with pytest.raises(KeyError):
    with eval_mode.EvalMode():
      raise KeyError('inside')
  assert not eval_mode.IsEvalMode()


class _Counter(base_layer.BaseLayer):
  """Identity that returns additive statistics (sum of inputs)."""
  HAS_OWN_UPDATES = True

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('total', weights.WeightParams(
        [], init=weights.WeightInit.Constant(0.0), collections=['non_trainable']))

  def FProp(self, theta, x):
    return x

  def FPropWithUpdates(self, theta, x):
    return x, NestedMap(total=tf.reduce_sum(x))

  def ApplyUpdates(self, updates):
    return [self.total.assign_add(updates.total)]


class _PlainContainer(base_layer.BaseLayer):
  """Holds an updating child but does not forward its updates."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('counter', _Counter.Params())

  def FProp(self, theta, x):
    return self.counter.FProp(theta.counter, x)


def test_fprop_with_updates_default_for_plain_layers():
  layer = _Affine.Params().Set(name='aff').Instantiate()
  assert not layer.HasUpdates()
  x = _Inputs()
  out, updates = layer.FPropWithUpdates(layer.theta, x)
  np.testing.assert_array_equal(out.numpy(), layer(x).numpy())
  assert updates == NestedMap()
  assert layer.ApplyUpdates(NestedMap()) == []


def test_container_without_fprop_with_updates_raises():
  layer = _PlainContainer.Params().Set(name='box').Instantiate()
  assert layer.HasUpdates()
  with pytest.raises(NotImplementedError, match=r"_PlainContainer 'box' contains "
                     r'layers with updates.*does not override FPropWithUpdates'):
    layer.FPropWithUpdates(layer.theta, _Inputs())


def test_updates_are_routed_to_children():
  layer = containers.SequentialLayer.Params().Set(name='seq', sub=[
      _Affine.Params().Set(input_dim=2, output_dim=2), _Counter.Params()
  ]).Instantiate()
  assert layer.HasUpdates()
  x = _Inputs()
  out, updates = layer.FPropWithUpdates(layer.theta, x)
  assert updates.sub[0] == NestedMap()
  layer.ApplyUpdates(updates)
  layer.ApplyUpdates(updates)
  np.testing.assert_allclose(layer.sub[1].total.numpy(),
                             2 * tf.reduce_sum(out).numpy(), rtol=1e-5)


def test_fprop_and_fprop_meta_must_be_defined():
  layer = base_layer.BaseLayer.Params().Set(name='base').Instantiate()
  with pytest.raises(NotImplementedError, match=r'BaseLayer does not define FProp'):
    layer(_Inputs())
  with pytest.raises(NotImplementedError, match=r'Affine does not define '
                     r'FPropMeta'):
    _Affine.FPropMeta(_Affine.Params(), [2, 2])


def test_walk_visits_the_layer_then_its_sublayers_in_creation_order():
  layer = _Build()
  assert [l.path for l in layer.Walk()] == [
      'top', 'top/first', 'top/stack_0', 'top/stack_1', 'top/heads_left',
      'top/heads_right']
  skipped = layer.Walk(enter=lambda l: l is not layer)
  assert [l.path for l in skipped] == ['top']
