"""Gives every test 8 logical CPU devices (set before TensorFlow initializes)."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top
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


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marker into the test's id
def pytest_collection_modifyitems(items) -> None:
  """Keeps the tests of a module with a module-scoped fixture on one xdist
  worker (`make test` runs --dist=loadgroup), so that fixture (often a
  trained model) is built once, not once per worker; the suite passes under
  any --dist, this only saves the second build."""
  for item in items:
    info = getattr(item, '_fixtureinfo', None)
    defs = info.name2fixturedefs.values() if info else ()
    if any(d.scope == 'module' for chain in defs for d in chain):
      item.add_marker(pytest.mark.xdist_group(item.module.__name__))
