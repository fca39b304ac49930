"""Discrete-event fleet simulator: months of a large training fleet through the real
repair policy (``core.repair.plan``), to compare effective training time per policy."""
