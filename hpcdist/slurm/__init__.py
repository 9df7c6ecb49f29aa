"""SLURM's own formats and clients: node lists, time limits, what scontrol/sacct/sinfo print,
and the probe of a cluster (version, partitions, plugins) that `hpcdist doctor` shows.

Pure parsing plus the thin calls that run SLURM's clients. A bottom layer: imports only
``errors`` (and the standard library).
"""
