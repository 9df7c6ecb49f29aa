"""Benchmarks of the emulator's training and of the CLI; run as ``python3 -m bench.X``.

ufsemulator.data and ufsemulator.synthetic import netCDF4 at module level although the
benchmarks never read or write a file (they make the arrays in memory). The GPU machines
have no netCDF4, so a machine without it gets an empty stand-in module here, before any
bench module imports ufsemulator; where netCDF4 is installed nothing changes.
"""

from __future__ import annotations

import sys
import types

try:
    import netCDF4  # noqa: F401
except ImportError:
    sys.modules["netCDF4"] = types.ModuleType("netCDF4")
