"""Byte-level language modelling with a GPipe Transformer stack."""
