"""SLURM's own formats and clients: node lists, time limits, what scontrol/sacct/sinfo print,
and the probe of a cluster (version, partitions, plugins) that `hpcdist doctor` shows.

Pure parsing plus the thin calls that run SLURM's clients, and the user's shared view of
their jobs (``userjobs``), kept as private state. Imports only ``state`` and ``errors``
(and the standard library).
"""
