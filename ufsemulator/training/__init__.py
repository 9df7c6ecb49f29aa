"""Training: the loop, data parallelism, the optimiser, sharded reading, signals, run files.

May import every other room of the package (data, model, checkpoints, export).
"""
