"""Gives every test 8 logical CPU devices (set before TensorFlow initializes),
and keeps what the imports made out of later garbage collections."""

import gc
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_LOGICAL_DEVICES = 8


def _ConfigureDevices() -> None:
  cpus = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_DEVICES)
  # Made now, so that a trainer run in the test process (tests/trainer/
  # in_process.py) finds them made and cannot configure fewer.
  tf.config.list_logical_devices('CPU')


_ConfigureDevices()


def pytest_collection_finish(session) -> None:
  """What TensorFlow and the test modules made on import lives as long as
  the worker: frozen, it is no longer traversed by each full garbage
  collection (about 390,000 objects, of 600,000 to 1,400,000 a worker
  holds), which the suite's traces set off some 130 times a run."""
  del session
  gc.collect()
  gc.freeze()
