"""The peer: Lingvo's GPipe measured on the standard workloads, in its own venv (see README.md)."""
