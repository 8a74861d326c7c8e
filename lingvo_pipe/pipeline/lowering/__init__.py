"""The one lowering: what a remat policy means, what a step of a schedule runs (the program), and its tables as loops. No TensorFlow."""
