"""Name scopes of the ops a cell builds in the step's own graph.

A kept forward (and its backward) is inlined into the step instead of
being called as a traced function; its ops carry these scopes, by which
the profiler tells them apart from the cells' function calls. So do a
cell's step gradients after its last backward (accumulator reads and the
deferred weight-gradient products: CellGradients.StepGradients), work of
its device that the timeline counts as busy. The replicas' all-reduce of
a cell's gradients (all_reduce.py) carries its own scope, which the
timeline shows as the device's ALL_REDUCE.
"""

KEPT_FORWARD_SCOPE = 'kept_forward'
KEPT_BACKWARD_SCOPE = 'kept_backward'
WEIGHT_GRADIENTS_SCOPE = 'step_weight_gradients'
ALL_REDUCE_SCOPE = 'replica_all_reduce'
