"""benchmarks/peak_parts.py on a hand-made trace of allocator events."""

import pytest

from benchmarks import peak_parts

_FLOAT32, _BFLOAT16 = 1, 14


def _Space(events):
  """An XSpace with a '/host:CPU' plane, one line holding `events`: (name,
  offset ps, stats)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name='/host:CPU')
  line = plane.lines.add(timestamp_ns=0)
  names: dict = {}

  def Id(table, name):
    if name not in names:
      names[name] = len(names) + 1
      table[names[name]].name = name
      table[names[name]].id = names[name]
    return names[name]

  for name, offset, stats in events:
    event = line.events.add(metadata_id=Id(plane.event_metadata, name),
                            offset_ps=offset, duration_ps=1)
    for key, value in stats.items():
      stat = event.stats.add(metadata_id=Id(plane.stat_metadata, key))
      if isinstance(value, str):
        stat.str_value = value
      else:
        stat.int64_value = value
  return space


def _Alloc(t, addr, size, in_use, dtype, op, shape):
  return ('MemoryAllocation', t, dict(addr=addr, allocation_bytes=size,
                                      bytes_allocated=in_use, data_type=dtype,
                                      tf_op=op, region_type='output', shape=shape))


def _Free(t, addr, size, in_use):
  return ('MemoryDeallocation', t, dict(addr=addr, allocation_bytes=size,
                                        bytes_allocated=in_use))


def test_live_tensors_at_the_peak():
  """1000 bytes in use before the step; a bf16 weight copy (100) and two
  activations (300, 200) alive at the peak (1600); one released before it,
  one allocated after it."""
  space = _Space([
      _Alloc(10, 1, 50, 1050, _FLOAT32, 'layer_0/ln/sub', '[2]'),
      _Free(20, 1, 50, 1000),
      _Alloc(30, 2, 100, 1100, _BFLOAT16, 'Cast_3', '[5,10]'),
      _Alloc(40, 3, 300, 1400, _FLOAT32, 'layer_1/atten/Softmax_2', '[3,25]'),
      _Alloc(50, 4, 200, 1600, _FLOAT32, 'layer_0/atten/Softmax', '[2,25]'),
      _Free(60, 3, 300, 1300),
      _Alloc(70, 5, 250, 1550, _FLOAT32, 'MatMul', '[5,10]'),
  ])
  parts = peak_parts.LiveAtPeak(space, top=10)
  assert parts['peak_bytes'] == 1600
  assert parts['step_allocated_live_bytes'] == 600
  assert parts['before_step_bytes'] == 1000
  assert parts['by_dtype'] == {'float32': 500, 'bfloat16': 100}
  assert parts['by_op'][0] == dict(group='float32 output atten/Softmax', tensors=2,
                                   bytes=500)
  assert {r['group']: r['bytes'] for r in parts['by_shape']} == {
      'float32 [3,25]': 300, 'float32 [2,25]': 200, 'bfloat16 [5,10]': 100}


def test_a_trace_without_allocator_events_is_refused():
  with pytest.raises(ValueError, match='TF_CPU_ALLOCATOR_USE_BFC=true'):
    peak_parts.LiveAtPeak(_Space([('FunctionRun', 0, {})]), top=5)
