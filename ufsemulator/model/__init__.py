"""The emulator model: the per-point MLP, its normalisation and its analytic Jacobian."""
