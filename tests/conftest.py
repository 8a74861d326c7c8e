"""Gives every test 8 logical CPU devices (set before TensorFlow initializes)."""

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
