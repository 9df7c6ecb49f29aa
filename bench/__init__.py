"""Benchmarks of the emulator's training and of the CLI; run as ``python3 -m bench.X``.

They make their arrays in memory and never read a netCDF file, so they import neither netCDF4
nor matplotlib: a GPU machine without them runs every benchmark.
"""
