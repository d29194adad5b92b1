"""How a run uses its devices and processes: precision, distributed, sharding, determinism."""
