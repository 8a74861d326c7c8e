"""Data parallelism: each replica's copies of the variables, its slice of the batch, the all-reduce of gradients."""
