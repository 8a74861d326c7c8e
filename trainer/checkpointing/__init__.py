"""The trainer's checkpoints: saving and restoring, their keys, conversion between layouts, the best-checkpoint keeper, warm starts and the checkpoint tool."""
