"""Training: the loop, data parallelism, the optimiser, signals, timings and run files."""
