"""The layer library, one family of layers per module."""
