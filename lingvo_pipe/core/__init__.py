"""Core of lingvo_pipe: params, layers, the pipeline and its planning."""
