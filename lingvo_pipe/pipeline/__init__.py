"""GPipe: the PipeliningLayer, its cells, remat policy, micro-batching, schedule, partition, planner and device placement."""
