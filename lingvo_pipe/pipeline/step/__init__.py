"""One training or evaluation step: the interface of its emissions, the unrolled executor, the custom gradients, and loop/."""
