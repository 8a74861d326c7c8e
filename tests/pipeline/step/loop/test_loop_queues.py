"""The loop step's queues belong to their pipeline: a retrace reuses them, two loop steps of one graph or two pipelines never share one."""

import tensorflow as tf

from tests.pipeline import pipeline_models as models


def _Pipeline(m=4):
  layers, shape = models.FfnLayers()
  return models.Pipeline(layers, shape, 2, m, loop_min_micro_batches=2), shape


def _QueueNames(pipe, shape, m, calls=1):
  """The shared names of the queues a traced training step makes (of
  `calls` steps of the pipeline in one function): a name per queue, which
  its producer's and its consumer's handle share."""
  def Step(x):
    return [pipe.FPropWithLoss(pipe.theta, models.MicroLoss(m), x)[0] for _ in range(calls)]

  graph = tf.function(Step, autograph=False).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
  names = [n.attr['shared_name'].s.decode() for n in nodes if n.op == 'FIFOQueueV2']
  assert len(names) == 2 * len(set(names))
  return set(names)


def test_a_retrace_reuses_the_queues_of_its_signature():
  """Every retrace of a step would otherwise leave 2(K-1)R queues alive
  for the process: the same names, so the same queues (each step drains
  them first); another M is another signature."""
  pipe, shape = _Pipeline()
  first = _QueueNames(pipe, shape, 4)
  assert first and first == _QueueNames(pipe, shape, 4)
  assert not first & _QueueNames(pipe, [8] + shape[1:], 4)
  # Two traces run in turn on the same queues, each as the other.
  x = tf.random.stateless_normal(shape, [1, 2])
  traces = [tf.function(lambda x: pipe.FPropWithLoss(pipe.theta, models.MicroLoss(4), x)[0],
                        autograph=False) for _ in range(2)]
  losses = [float(traces[i](x)) for i in (0, 1, 0, 1)]
  assert losses == [losses[0]] * 4, losses


def test_loop_steps_of_one_graph_and_two_pipelines_never_share_a_queue():
  pipe, shape = _Pipeline()
  twice = _QueueNames(pipe, shape, 4, calls=2)
  assert len(twice) == 2 * len(_QueueNames(pipe, shape, 4))
  other, _ = _Pipeline()
  assert not _QueueNames(other, shape, 4) & twice
