"""The emulator's data: finding and reading CICE/CF netCDF files, synthetic files and seasons.

Imports ``config``, ``variables`` and ``errors`` of the package; never training or the model.
"""
