"""The README's Python example runs as written, in a fresh process (its
logical devices must be set before TensorFlow starts)."""

from tests import doc_blocks
from tests import fresh_process


def test_the_readme_example_trains_a_step_on_four_devices():
  example = doc_blocks.Code((fresh_process.ROOT / 'README.md').read_text(), 'python')[0]
  check = ('\nprint(logits.shape, loss.shape, sum(g is not None for g in grads))\n'
           'print(*[d.name.split("/")[-1] for d in pipe.plan.devices])\n')
  result = fresh_process.RunPython('-c', example + check, timeout_s=300)
  assert result.stdout.splitlines() == [
      '(32, 64) () 16', 'device:CPU:0 device:CPU:1 device:CPU:2 device:CPU:3'], result.stdout
