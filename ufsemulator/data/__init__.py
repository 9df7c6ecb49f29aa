"""The emulator's data: finding and reading CICE/CF netCDF files, sharding, synthetic files."""
