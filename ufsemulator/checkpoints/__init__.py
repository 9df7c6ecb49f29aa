"""Checkpoints: the training state as types, the files, the background writer."""
