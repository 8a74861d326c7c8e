"""Which of a device's cell calls in a profiled step are forwards and which backwards.

timeline.Intervals hands each device's calls here with the phases its
schedule gives the device; the calls' events come from trace_calls.
"""

from typing import List, Optional, Sequence, Tuple

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules.actions import ActionKind
from lingvo_pipe.profiling import trace_calls
from lingvo_pipe.profiling.trace_calls import Call


def DevicePhases(schedule: Optional[actions.Schedule], device: int,
                 num_calls: int) -> List[ActionKind]:
  """The kinds of device `device`'s cell calls in schedule order: F, or the
  backward's B or I (a W calls no cell); without a schedule, fill-drain's:
  num_calls // 2 forwards, then as many backwards."""
  if schedule is None:
    return [ActionKind.F] * (num_calls // 2) + [ActionKind.B] * (num_calls - num_calls // 2)
  return [a.kind for a in schedule.devices[device]
          if a.kind in (ActionKind.F,) + actions.INPUT_BACKWARDS]


def Split(calls: List[Call], phases: Sequence[ActionKind]
          ) -> Tuple[List[Call], List[Call]]:
  """(forward calls, backward calls) of one device, each in time order;
  `calls` in time order, `phases` those of the device's schedule
  (DevicePhases).

  A kept micro-batch's calls say what they are by their scope. Of the
  others, a device runs as many forwards as backwards, and a forward runs
  fewer distinct ops than a backward (which reruns part of it and adds
  gradient ops): the half of the calls with the fewest ops are the
  forwards. Counts of one function vary (the profiler misses short ops: ffn
  K=2 M=16 with one thread per device saw 16 to 20 in forwards, 49 to 317
  in backwards). Forward calls are not always the first ones: a last cell's
  forward whose outputs no gradient needs may run late.

  Compiled calls run no ops the trace shows, so on a device with any, the
  calls take `phases` in time order (_SplitInScheduleOrder).
  """
  if any(c.compiled for c in calls):
    return _SplitInScheduleOrder(calls, phases)
  forwards = [c for c in calls if c.scope == trace_calls.KEPT_FORWARD_SCOPE]
  backwards = [c for c in calls if c.scope == trace_calls.KEPT_BACKWARD_SCOPE]
  called = [c for c in calls if c.scope is None]
  sizes = [len({name for name, _ in call.Ops()}) for call in called]
  by_size = sorted(range(len(called)), key=lambda i: sizes[i])
  half = len(called) // 2
  if (len(forwards) != len(backwards) or len(called) % 2 or
      (called and sizes[by_size[half - 1]] == sizes[by_size[half]])):
    raise ValueError(f'A device ran {len(called)} cell calls with distinct op '
                     f'counts {sorted(sizes)}, {len(forwards)} kept forwards '
                     f'and {len(backwards)} kept backwards: not M forwards '
                     'and M larger backwards; the trace is not one GPipe '
                     'step (profile exactly one, with steps_per_loop=1).')
  forwards += [called[i] for i in by_size[:half]]
  backwards += [called[i] for i in by_size[half:]]

  def InTimeOrder(some: List[Call]) -> List[Call]:
    return sorted(some, key=lambda c: c.Span()[0])

  return InTimeOrder(forwards), InTimeOrder(backwards)


def _SplitInScheduleOrder(calls: List[Call], phases: Sequence[ActionKind]
                          ) -> Tuple[List[Call], List[Call]]:
  """(forward calls, backward calls) of a device whose cells are compiled:
  its i-th call in time order runs the phase of its i-th task, as the
  control edges between a device's calls keep its schedule's order.

  A compiled forward and the compiled backward of a micro-batch whose
  activations the cell keeps are alike in the trace (one XLA program run
  each); a recomputing backward is an uncompiled call with per-op events
  (its accumulator updates) around its compiled gradient, and every
  forward is compiled: a call that contradicts this raises.
  """
  if len(calls) != len(phases):
    raise ValueError(f'A device ran {len(calls)} cell calls; its schedule has '
                     f'{len(phases)} tasks: the trace is not one pipeline step '
                     '(profile exactly one, with steps_per_loop=1).')
  forwards: List[Call] = []
  backwards: List[Call] = []
  for i, (call, phase) in enumerate(zip(calls, phases)):
    if phase == ActionKind.F and not call.compiled:
      raise ValueError(f'Call {i} of a device with compiled cells has per-op '
                       'events where its schedule runs a forward: its calls '
                       'did not run in schedule order, which the timeline of '
                       'compiled cells needs.')
    (forwards if phase == ActionKind.F else backwards).append(call)
  return forwards, backwards
