"""What a pipeline decides once, at build: its cells and partition, devices, micro-batch contract, cell compilation and plan."""
