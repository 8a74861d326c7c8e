"""Bad pipeline configurations fail at build or trace time, before any step
runs, with the clashing values in the message."""

import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import weights
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind


def _Layers(n=4, dim=8):
  return [linear.ProjectionLayer.Params().Set(name=f'proj{i}', input_dim=dim, output_dim=dim)
          for i in range(n)]


def _Params(**kwargs):
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=_Layers(),
                                         num_partitions=2, input_shapes=[[16, 8]])
  return p.Set(**kwargs)


def test_micro_batches_not_dividing_batch_at_build():
  with pytest.raises(ValueError, match=r"^PipeliningLayer 'pipe': num_micro_batches \(3\) "
                     r'must divide the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'):
    _Params(num_micro_batches=3).Instantiate()


def test_a_schedule_text_takes_num_micro_batches_not_micro_batch_size():
  with pytest.raises(ValueError, match=r"'pipe': schedule_text names its micro-batches, so "
                     r'it fixes M; set num_micro_batches to its M instead of '
                     r'micro_batch_size \(4\)'):
    _Params(micro_batch_size=4, schedule_text='0F0,0F1,0B0,0B1;1F0,1B0,1F1,1B1').Instantiate()


@pytest.mark.parametrize('value', [-1, 2.5, 'auto'])
def test_loop_min_micro_batches_out_of_range(value):
  with pytest.raises(ValueError, match=rf"'pipe': loop_min_micro_batches={value!r}; give "
                     r'None \(loop from the M measured'):
    _Params(loop_min_micro_batches=value).Instantiate()


def test_a_loop_asked_for_under_remat_none_says_it_recomputes(caplog):
  """A loop cannot keep what remat NONE keeps unrolled (program.py): asked
  for explicitly, one line says so at build; by default NONE never loops."""
  with caplog.at_level('WARNING'):
    _Params(num_micro_batches=4, remat=gpipe.RematPolicy.NONE,
            loop_min_micro_batches=2).Instantiate()
  (line,) = [r.getMessage() for r in caplog.records if 'remat NONE' in r.getMessage()]
  assert line == ("PipeliningLayer 'pipe': remat NONE in a loop step (loop_min_micro_batches=2) "
                  "keeps only the last cell's forwards and recomputes every other, as "
                  'PER_CELL does (pipeline/lowering/program.py); set loop_min_micro_batches=0 to keep '
                  'them all.')
  caplog.clear()
  with caplog.at_level('WARNING'):
    _Params(num_micro_batches=4, remat=gpipe.RematPolicy.NONE).Instantiate()
  assert not [r for r in caplog.records if 'remat NONE' in r.getMessage()]


@pytest.mark.parametrize('schedule,v', [(ScheduleKind.ZB_V, 1), (ScheduleKind.INTERLEAVED, 2)])
def test_two_cells_at_two_per_device_are_refused_as_one_device(schedule, v):
  """num_partitions counts cells: 2 of them at 2 per device ran on one."""
  with pytest.raises(ValueError, match=rf"'pipe': {schedule.name} puts 2 cells on each "
                     r'device, so 2 cells are one device, no pipeline: num_partitions '
                     r'counts cells; set it to 4 for 2 devices'):
    _Params(schedule=schedule, cells_per_device=v).Instantiate()


@pytest.mark.parametrize('params', [dict(schedule=ScheduleKind.ONE_F_ONE_B),
                                    dict(schedule_text='0F0,0F1,0B0,0B1;1F0,1B0,1F1,1B1')])
def test_fprop_refuses_to_train_a_schedule_that_needs_the_loss_inside(params):
  pipe = _Params(num_micro_batches=2, **params).Instantiate()
  name = 'the schedule of schedule_text' if 'schedule_text' in params else (
      'schedule ONE_F_ONE_B')
  with pytest.raises(ValueError, match=rf"^PipeliningLayer 'pipe': {name} starts backwards "
                     r'before the last forward, so it trains with the loss inside the '
                     r'pipeline: call FPropWithLoss\(theta, loss_fn, \*inputs\) instead'):
    pipe.FProp(pipe.theta, tf.ones([16, 8]))


def test_micro_batches_not_dividing_batch_at_trace():
  pipe = _Params(input_shapes=None, splits=[2], num_partitions=0,
                 num_micro_batches=4).Instantiate()
  with pytest.raises(ValueError, match=r'num_micro_batches \(4\) must divide the batch size \(6\)'):
    pipe(tf.zeros([6, 8]))


@pytest.mark.parametrize('m', [0, -2])
def test_zero_or_negative_micro_batches(m):
  with pytest.raises(ValueError, match=rf'num_micro_batches \({m}\) must be >= 1'):
    _Params(num_micro_batches=m).Instantiate()


@pytest.mark.parametrize('k', [0, -1])
def test_zero_or_negative_cells(k):
  with pytest.raises(ValueError, match=rf'num_partitions \({k}\) must be >= 1'):
    _Params(num_partitions=k).Instantiate()


def test_more_cells_than_devices():
  with pytest.raises(ValueError, match='3 cells need 3 devices but only 2'):
    _Params(num_partitions=3, devices=['CPU:0', 'CPU:1']).Instantiate()


def test_more_cells_than_layers():
  with pytest.raises(ValueError, match='Cannot split 4 layers into 5 cells'):
    _Params(num_partitions=5).Instantiate()


def test_device_that_does_not_exist():
  with pytest.raises(ValueError, match='CPU:9.*does not exist'):
    _Params(devices=['CPU:0', 'CPU:9']).Instantiate()


def test_cell_output_does_not_fit_next_cell():
  layers = _Layers(2) + [linear.ProjectionLayer.Params().Set(name='odd', input_dim=5, output_dim=8)]
  with pytest.raises(ValueError, match=r'Cell 1 does not accept the output of cell 0 '
                     r"\(shapes \['\(16, 8\)'\]\).*odd"):
    _Params(layers=[], cell_tpl=[
        containers.SequentialLayer.Params().Set(name='a', sub=layers[:2]),
        containers.SequentialLayer.Params().Set(name='b', sub=layers[2:])]).Instantiate()


def test_first_cell_does_not_fit_the_inputs():
  with pytest.raises(ValueError, match=r"Cell 0 does not accept the pipeline's inputs "
                     r"\(shapes \['\(16, 5\)'\]\)"):
    _Params(input_shapes=[[16, 5]], splits=[2], num_partitions=0).Instantiate()


class _NoMeta(base_layer.BaseLayer):

  def FProp(self, theta, x):
    return x


class _BareShapeMeta(_NoMeta):

  @classmethod
  def FPropMeta(cls, params, x):
    return layer_meta.LayerMeta(tf.TensorShape(x))


@pytest.mark.parametrize('layer,error,match', [
    (_NoMeta, NotImplementedError, r'_NoMeta does not define FPropMeta, which the automatic '
     r"partition \(PipeliningLayer's num_partitions\) and its input_shapes need.*splits"),
    (_BareShapeMeta, TypeError, r'LayerMeta.out_shapes must be a tuple, one entry per output'),
])
def test_a_layer_without_a_usable_fprop_meta(layer, error, match):
  with pytest.raises(error, match=match):
    _Params(layers=_Layers(2) + [layer.Params().Set(name='custom')]).Instantiate()


def test_empty_cell():
  with pytest.raises(ValueError, match='cell 1 is empty'):
    _Params(layers=[], cell_tpl=[
        containers.SequentialLayer.Params().Set(name='a', sub=_Layers(2)),
        containers.SequentialLayer.Params().Set(name='b', sub=[])]).Instantiate()


def test_bad_manual_splits():
  with pytest.raises(ValueError, match=r'Split points \[2, 2\] for 4 layers'):
    _Params(splits=[2, 2], num_partitions=0).Instantiate()


def test_no_cells_at_all():
  with pytest.raises(ValueError, match='has no cells'):
    _Params(layers=[]).Instantiate()


def test_auto_partition_needs_shapes():
  with pytest.raises(ValueError, match='needs input_shapes'):
    _Params(input_shapes=None).Instantiate()


class _Counted(linear.ProjectionLayer):
  """Counts its instances."""
  built = 0

  def __init__(self, params):
    super().__init__(params)
    _Counted.built += 1


@pytest.mark.parametrize('bad', [dict(devices=['CPU:0', 'CPU:9']),
                                 dict(num_micro_batches=3),
                                 dict(num_partitions=5)])
def test_no_layer_is_built_when_config_is_bad(bad):
  """Validation happens before any cell (and any variable) is created."""
  layers = [_Counted.Params().Set(name=f'c{i}', input_dim=8, output_dim=8) for i in range(4)]
  _Counted.built = 0
  _Params(layers=layers).Instantiate()
  assert _Counted.built == 4
  _Counted.built = 0
  with pytest.raises(ValueError):
    _Params(layers=layers, **bad).Instantiate()
  assert _Counted.built == 0


class _ReadsSelfW(base_layer.BaseLayer):
  """A porting slip: reads its weight as self.w, not theta.w."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', weights.WeightParams([8, 8]))

  def FProp(self, theta, x):
    return tf.matmul(x, self.w)


@pytest.mark.parametrize('loss_inside', [False, True])
@pytest.mark.parametrize('eager', [False, True])
def test_a_layer_reading_its_variable_outside_theta_is_refused(loss_inside, eager):
  """Its weight would get no gradient (a zero one with the loss inside):
  the step refuses, naming the variable."""
  layers = _Layers(2) + [_ReadsSelfW.Params().Set(name='slip')]
  pipe = _Params(layers=layers, splits=[2], num_partitions=0, input_shapes=None,
                 num_micro_batches=2).Instantiate()
  x = tf.ones([16, 8])

  def Step():
    with tf.GradientTape() as tape:
      if loss_inside:
        loss, _ = pipe.FPropWithLoss(pipe.theta, tf.reduce_sum, x)
      else:
        loss = tf.reduce_sum(pipe.FProp(pipe.theta, x))
    return tape.gradient(loss, pipe.trainable_variables)

  with pytest.raises(ValueError, match=r"read trainable variables directly, not from theta: "
                     r"\['pipe/slip/w:0'\]"):
    Step() if eager else tf.function(Step, autograph=False)()
