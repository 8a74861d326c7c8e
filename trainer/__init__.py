"""The trainer binary and its training loop."""
