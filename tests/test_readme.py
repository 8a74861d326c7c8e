"""The README's Python example runs as written, in a fresh process (its
logical devices must be set before TensorFlow starts)."""

import re

from tests import fresh_process

_PYTHON_BLOCK = re.compile(r'^```python\n(.*?)^```', re.MULTILINE | re.DOTALL)


def test_the_readme_example_builds_a_pipeline_on_four_devices_that_runs():
  example = _PYTHON_BLOCK.findall((fresh_process.ROOT / 'README.md').read_text())[0]
  check = ('\nprint(pipe.FProp(pipe.theta, tf.ones([32, 64])).shape)\n'
           'print(*[d.name.split("/")[-1] for d in pipe.plan.devices])\n')
  result = fresh_process.RunPython('-c', example + check, timeout_s=300)
  assert result.stdout.splitlines() == [
      '(32, 64)', 'device:CPU:0 device:CPU:1 device:CPU:2 device:CPU:3'], result.stdout
