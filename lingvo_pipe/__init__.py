"""lingvo_pipe: GPipe pipeline parallelism as a Lingvo-style layer framework on TensorFlow 2."""
