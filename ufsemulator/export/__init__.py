"""Export of the trained emulator for the C++ data-assimilation system (TorchScript)."""
