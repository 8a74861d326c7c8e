"""Profiling a pipeline step: the trace of its cell calls, the timeline and its Gantt chart."""
