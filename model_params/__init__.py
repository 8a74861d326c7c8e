"""Registered experiments: model params classes run by the trainer."""
