"""The emulator's data: finding and reading CICE/CF netCDF files, synthetic files and seasons.

Imports ``variables`` and ``errors`` of the package; never the config, training or the model
(the config imports this room, not the other way round).
"""
