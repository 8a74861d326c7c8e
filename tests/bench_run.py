"""Runs benchmarks/pipeline_bench.py for one configuration in a fresh
process, under TensorFlow's BFC allocator on CPU (so its peak and what it
holds between steps are measured, per process: docs/design.md), and
returns the JSON object it prints (docs/workloads.md names its keys)."""

import json
from typing import Any, Dict

from tests import fresh_process


def PipelineBench(*flags: str) -> Dict[str, Any]:
  """pipeline_bench's result for `flags` (e.g. '--workload=ffn', '--k=2'),
  printed too, so that a failing test shows every run it compared."""
  out = fresh_process.RunPython('-m', 'benchmarks.pipeline_bench', *flags,
                                env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}).stdout
  result = json.loads(out.strip().splitlines()[-1])
  print(result)
  return result
