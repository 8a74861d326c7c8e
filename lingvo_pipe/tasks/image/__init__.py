"""Image classification with a pipelined convnet (AmoebaNet-D)."""
