"""Benchmark programs; each prints JSON."""
